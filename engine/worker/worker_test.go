package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfigIsValidAndDocumented(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{Role: "aggregated", Model: "sim", ModelName: "kvstrata-sim", Listen: "127.0.0.1:8000",
		Cache: "127.0.0.1:7070", KVEvents: "tcp://127.0.0.1:5557", KVEventsReplay: "tcp://127.0.0.1:5558",
		KVEventsEncoding: "arrays", Speedup: 1, TokenBytes: 64, TinySeed: 1, Blocks: 4096, ContextLen: 65536}
	c.Logger = nil
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("DefaultConfig() = %+v\nwant %+v", c, want)
	}
	tinyCfg := Config{Model: "tiny"}
	tinyCfg.EnsureDefaults()
	if tinyCfg.ModelName != "kvstrata-tiny" || tinyCfg.ContextLen != 4096 || tinyCfg.Cache != "" || tinyCfg.KVEvents != "" {
		t.Fatalf("tiny defaults %+v: want kvstrata-tiny, context 4096, no cache and no events (zero means off)", tinyCfg)
	}
}

func TestValidateNamesEveryBadField(t *testing.T) {
	c := Config{Role: "router", Model: "llama", Listen: "nowhere", Cache: "also-nowhere",
		KVEvents: "ipc:///tmp/x", KVEventsReplay: "tcp://127.0.0.1", KVEventsEncoding: "json", Speedup: -1,
		TokenBytes: 3, Blocks: -1, MaxNumSeqs: -2, MaxNumBatchedTokens: -3, ContextLen: 1}
	c.EnsureDefaults()
	err := c.Validate()
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Validate() = %v, want ErrBadConfig", err)
	}
	for _, want := range []string{`Role "router"`, `Model "llama"`, `Listen: "nowhere"`, `Cache: "also-nowhere"`,
		`KVEvents: "ipc:///tmp/x"`, `KVEventsReplay: endpoint "tcp://127.0.0.1"`, `KVEventsEncoding "json"`, "Speedup is -1",
		"TokenBytes is 3", "Blocks is -1", "MaxNumSeqs is -2", "MaxNumBatchedTokens is -3", "ContextLen is 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %s:\n%v", want, err)
		}
	}

	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{ModelName: " x"}, `ModelName " x" must be non-empty, without surrounding spaces`},
		{Config{Role: RolePrefill}, "Role prefill needs a Cache"},
		{Config{Role: RoleDecode}, "Role decode needs a Cache"},
		{Config{KVEventsReplay: "tcp://127.0.0.1:5558"}, "KVEvents is off"},
		{Config{Model: "tiny", SimProfile: "p.json"}, "SimProfile is set but Model is tiny"},
		{Config{Blocks: 10, ContextLen: 161}, "ContextLen is 161, more than the pool's 10 blocks"},
	} {
		c.cfg.EnsureDefaults()
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Validate() = %v, want %q", c.cfg, err, c.want)
		}
		if _, err := New(c.cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("New accepted %+v: %v", c.cfg, err)
		}
	}
}

// startWorker starts a sim worker without cache or events on a free port.
func startWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return w
}

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestWorkerAnswersCompletionsAndShowsItsRole(t *testing.T) {
	w := startWorker(t, Config{Speedup: 100})
	base := "http://" + w.Addr()
	status, body := post(t, base+"/v1/completions",
		`{"model":"kvstrata-sim","prompt":"The cache exists for inference workers, and for nothing else.","max_tokens":5,"temperature":0}`)
	if status != http.StatusOK {
		t.Fatalf("completion: %d %s", status, body)
	}
	var res struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens, CompletionTokens int
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].FinishReason != "length" || res.Choices[0].Text == "" {
		t.Fatalf("choices %+v, want one of 5 tokens ending by length", res.Choices)
	}
	if status, body := post(t, base+"/v1/completions", `{"model":"gpt-5","prompt":"x"}`); status != http.StatusNotFound {
		t.Errorf("unknown model: %d %s, want 404", status, body)
	}
	if status, _ := get(t, base+"/health"); status != http.StatusOK {
		t.Errorf("/health: %d", status)
	}
	_, metrics := get(t, base+"/metrics")
	for _, want := range []string{`kvstrata_worker_info{backend="sim",model_name="kvstrata-sim",role="aggregated"} 1`,
		`vllm:generation_tokens_total{model_name="kvstrata-sim"} 5`, "go_goroutines", "process_open_fds"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestWorkerStartFailsClearlyOnABusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err := New(Config{Listen: ln.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	err = w.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "HTTP: listen on "+ln.Addr().String()) {
		t.Fatalf("Start on a busy address: %v, want an error naming it", err)
	}
	if w.Ready() == nil {
		t.Error("a worker that failed to start says it is ready")
	}
}

func TestStoppedWorkerIsUnhealthyAndFreesItsPort(t *testing.T) {
	w, err := New(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := w.Addr()
	if w.Ready() != nil {
		t.Fatal("a started worker is not ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(w.Ready(), ErrNotServing) {
		t.Errorf("Ready after Stop = %v", w.Ready())
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the stopped worker's port %s is still taken: %v", addr, err)
	}
	ln.Close()
}

// The engine's and the connector's metrics share the worker's registry
// without a clash, and a worker whose cache is not up yet starts and
// serves, recomputing.
func TestWorkerWithAnAbsentCacheStartsAndServes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	absent := ln.Addr().String()
	ln.Close() // nothing listens there now
	w := startWorker(t, Config{Speedup: 100, Cache: absent})
	status, body := post(t, "http://"+w.Addr()+"/v1/completions",
		`{"prompt":"A prompt long enough to fill two blocks of sixteen tokens each, so that the worker would offload them to its cache if it had one up.","max_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("completion with the cache down: %d %s", status, body)
	}
	_, metrics := get(t, "http://"+w.Addr()+"/metrics")
	for _, want := range []string{"kvstrata_engine_offload_blocks_total", "kvstrata_engine_cache_errors_total{model_name=\"kvstrata-sim\",op=\"lookup\"}",
		"kvstrata_engine_cache_failures_total", "vllm:num_requests_running"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

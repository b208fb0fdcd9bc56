package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/openai"
)

func TestDefaultConfigIsValidAndDocumented(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{Role: "aggregated", Model: "sim", ModelName: "kvstrata-sim", Listen: "127.0.0.1:8000",
		Cache: "127.0.0.1:7070", KVEvents: "tcp://127.0.0.1:5557", KVEventsReplay: "tcp://127.0.0.1:5558",
		KVEventsEncoding: "arrays", Speedup: 1, TokenBytes: 64, TinySeed: 1, Blocks: 4096, ContextLen: 65536,
		HTTP: openai.Limits{MaxConns: 4096, HeaderTimeout: 10 * time.Second, BodyTimeout: 10 * time.Second, MinBodyRate: 64 << 10,
			IdleTimeout: time.Minute, WriteStallTimeout: 30 * time.Second}}
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
		TokenBytes: 3, Blocks: -1, MaxNumSeqs: -2, MaxNumBatchedTokens: -3, ContextLen: 1,
		HTTP: openai.Limits{MaxConns: -1, BodyTimeout: -time.Second}}
	c.EnsureDefaults()
	err := c.Validate()
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Validate() = %v, want ErrBadConfig", err)
	}
	for _, want := range []string{`Role "router"`, `Model "llama"`, `Listen: "nowhere"`, `Cache: "also-nowhere"`,
		`KVEvents: "ipc:///tmp/x"`, `KVEventsReplay: endpoint "tcp://127.0.0.1"`, `KVEventsEncoding "json"`, "Speedup is -1",
		"TokenBytes is 3", "Blocks is -1", "MaxNumSeqs is -2", "MaxNumBatchedTokens is -3", "ContextLen is 1",
		"HTTP: MaxConns is -1", "HTTP: BodyTimeout is -1s"} {
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
		`vllm:generation_tokens_total{model_name="kvstrata-sim"} 5`, "go_goroutines", "process_open_fds",
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="4096"} 1`} { // the default pool, as vLLM tells its size
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

// A client that stops reading a long stream, keeping its connection open,
// does not hold the engine: once a write has made no progress for
// WriteStallTimeout its request is aborted and its blocks freed.
func TestStoppedStreamReaderFreesItsEngineRequest(t *testing.T) {
	// A million tokens: the request cannot end by its length in the test's
	// time, only by being aborted.
	w := startWorker(t, Config{Speedup: 1000, Blocks: 1 << 16, HTTP: openai.Limits{WriteStallTimeout: 300 * time.Millisecond}})
	base := "http://" + w.Addr()
	// A small receive buffer from the start (a window the server fills
	// soon), set before connecting.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
	}}
	nc, err := d.Dial("tcp", w.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body := `{"prompt":"Tell a story that never ends.","max_tokens":1000000,"ignore_eos":true,"stream":true}`
	fmt.Fprintf(nc, "POST /v1/completions HTTP/1.1\r\nHost: worker\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReaderSize(nc, 512), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatalf("the first event: %v", err)
	}
	waitMetrics(t, base, "the stream's request running", `vllm:num_requests_running{model_name="kvstrata-sim"} 1`)
	// The client reads no more, and keeps its connection open.
	metrics := waitMetrics(t, base, "the request of a client that stopped reading aborted and its blocks freed",
		`vllm:num_requests_running{model_name="kvstrata-sim"} 0`,
		`vllm:request_success_total{finished_reason="abort",model_name="kvstrata-sim"} 1`,
		`vllm:kv_cache_usage_perc{model_name="kvstrata-sim"} 0`)
	t.Log(grepLines(metrics, "generation_tokens_total"))
}

// waitMetrics polls the worker's /metrics until it has every line of
// wants, failing after 60 s; it returns the last scrape.
func waitMetrics(t *testing.T, base, what string, wants ...string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, metrics := get(t, base+"/metrics")
		missing := ""
		for _, want := range wants {
			if !strings.Contains(metrics, want+"\n") {
				missing = want
				break
			}
		}
		if missing == "" {
			return metrics
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within 60 s: %s (no %s):\n%s", what, missing, grepLines(metrics, "vllm:"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grepLines is the lines of s that contain sub, for failure messages.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// End-to-end tests of `kvstrata worker` and `kvstrata up` with real
// processes: a cache node and workers, driven over HTTP by the official
// OpenAI Go SDK, scraped with promtool, subscribed to from Python.

// wproc is a running `kvstrata worker`.
type wproc struct {
	*proc
	url            string // http://host:port
	events, replay string // ZMQ endpoints, "" when off
}

// startWorkerProcess starts `kvstrata worker` on free ports with the cache node at
// cache ("" for none), KV events on, and extra flags, and waits until its
// /health answers.
func startWorkerProcess(t *testing.T, cache string, extra ...string) *wproc {
	t.Helper()
	w := &wproc{proc: &proc{t: t}, events: "tcp://" + freeport.Addr(t), replay: "tcp://" + freeport.Addr(t)}
	w.http = freeport.Addr(t)
	w.url = "http://" + w.http
	w.args = append([]string{"worker", "--listen", w.http, "--cache", cache, "--kv-events", w.events,
		"--kv-events-replay", w.replay, "--num-gpu-blocks", "512", "--shutdown-timeout", "10s"}, extra...)
	w.launch()
	w.waitHealthy()
	return w
}

// waitHealthy waits until the worker's /health answers 200.
func (w *wproc) waitHealthy() {
	w.t.Helper()
	waitWorkerHealth(w.t, w.proc, w.url)
}

func waitWorkerHealth(t *testing.T, p *proc, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // tiny's weights take a while under -race
	for {
		if resp, err := http.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("kvstrata exited while starting: %v\n%s", err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy after 60s:\n%s", url, p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restart stops the worker with SIGTERM and starts it again, same flags.
func (w *wproc) restart() {
	w.t.Helper()
	w.stop()
	w.launch()
	w.waitHealthy()
}

func (w *wproc) sdk() *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(w.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return &c
}

// scrapeWorker returns the worker's /metrics.
func scrapeWorker(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// workerMetricSum is the sum of every sample of the metric name (any labels) in
// a scrapeWorker.
func workerMetricSum(body, name string) float64 {
	var sum float64
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum
}

// workerComplete sends a greedy completion of prompt and returns it.
func workerComplete(t *testing.T, w *wproc, prompt string, maxTokens int64) *sdk.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := w.sdk().Completions.New(ctx, sdk.CompletionNewParams{
		Prompt:      sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
		Model:       "",
		MaxTokens:   sdk.Int(maxTokens),
		Temperature: sdk.Float(0),
	})
	if err != nil {
		t.Fatalf("completion: %v\n%s", err, w.log)
	}
	if len(res.Choices) != 1 {
		t.Fatalf("%d choices", len(res.Choices))
	}
	return res
}

const workerPrompt = "The cache exists for inference workers. A prefill worker computes the keys and values " +
	"of every token of a prompt, layer by layer; the full blocks go to kvstrata, which keeps them in DRAM, " +
	"moves them to SSD as they cool, and to the object store after that. A decode worker, or the same worker " +
	"an hour later, asks for the longest prefix the cache holds and computes only the rest."

func TestWorkerServesTheOpenAISDKAndVLLMMetrics(t *testing.T) {
	node := startNode(t, t.TempDir())
	w := startWorkerProcess(t, node.grpc, "--model", "sim", "--speedup", "20")
	res, err := w.sdk().Completions.New(context.Background(), sdk.CompletionNewParams{
		Model:     "kvstrata-sim",
		Prompt:    sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Hello, worker")},
		MaxTokens: sdk.Int(6),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Choices[0].FinishReason != "length" || res.Usage.CompletionTokens != 6 || res.Model != "kvstrata-sim" {
		t.Fatalf("completion %+v", res)
	}
	stream := w.sdk().Chat.Completions.NewStreaming(context.Background(), sdk.ChatCompletionNewParams{
		Model:         "kvstrata-sim",
		Messages:      []sdk.ChatCompletionMessageParamUnion{sdk.SystemMessage("Be brief."), sdk.UserMessage("What is a KV cache?")},
		MaxTokens:     sdk.Int(8),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	})
	var acc sdk.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 2 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 8 {
		t.Fatalf("%d chunks, accumulated %+v", chunks, acc.ChatCompletion)
	}
	models, err := w.sdk().Models.List(context.Background())
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "kvstrata-sim" {
		t.Fatalf("models %+v %v", models, err)
	}

	body := scrapeWorker(t, w.url)
	for _, want := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
		"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_bucket",
		"vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
		`vllm:prompt_tokens_total{model_name="kvstrata-sim"}`, `vllm:generation_tokens_total{model_name="kvstrata-sim"} 14`,
		`kvstrata_worker_info{backend="sim",model_name="kvstrata-sim",role="aggregated"} 1`,
		"kvstrata_engine_offload_blocks_total", "process_resident_memory_bytes"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	promtoolCheckWorker(t, body)
}

// promtoolCheckWorker runs promtool check metrics on a scrapeWorker. vLLM's metric
// names contain a colon, which promtool's lint flags ("should not contain
// ':'"): they are kept as vLLM has them, so that what reads vLLM reads a
// worker; any other finding fails the test.
func promtoolCheckWorker(t *testing.T, body string) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian package prometheus)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 3) { // 3: lint findings only
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !(strings.HasPrefix(line, "vllm:") && strings.HasSuffix(line, "metric names should not contain ':'")) {
			t.Errorf("promtool: %s", line)
		}
	}
}

// A worker that restarts has an empty pool: the prompt it served before
// comes back from kvstrata, and tiny's greedy text is identical.
func TestRestartedWorkerOnboardsFromTheCacheAndAnswersTheSame(t *testing.T) {
	node := startNode(t, t.TempDir())
	w := startWorkerProcess(t, node.grpc, "--model", "tiny", "--kv-events", "", "--kv-events-replay", "")
	first := workerComplete(t, w, workerPrompt, 4)
	full := first.Usage.PromptTokens / 16
	if full < 4 || first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first run: usage %+v; want ≥ 4 full blocks, none cached", first.Usage)
	}
	// Offloading is in the background: wait until the prompt's blocks are stored.
	eventually(t, 20*time.Second, "the worker offloads the prompt's blocks", func() bool {
		return workerMetricSum(scrapeWorker(t, w.url), "kvstrata_engine_offload_blocks_total") >= float64(full)
	})
	w.restart()
	second := workerComplete(t, w, workerPrompt, 4)
	if got := second.Usage.PromptTokensDetails.CachedTokens; got != full*16 {
		t.Errorf("after the restart %d prompt tokens were cached, want the %d of its full blocks", got, full*16)
	}
	body := scrapeWorker(t, w.url)
	if n := workerMetricSum(body, "kvstrata_engine_onboard_blocks_total"); n < float64(full) {
		t.Errorf("kvstrata_engine_onboard_blocks_total is %v, want ≥ %d", n, full)
	}
	if n := workerMetricSum(body, "kvstrata_engine_onboarded_tokens_total"); n != float64(full*16) {
		t.Errorf("kvstrata_engine_onboarded_tokens_total is %v, want %d", n, full*16)
	}
	if first.Choices[0].Text != second.Choices[0].Text {
		t.Errorf("tiny answered %q from scratch and %q with the prefix from kvstrata", first.Choices[0].Text, second.Choices[0].Text)
	}
}

// A cache node that goes away costs recomputation, not requests.
func TestWorkerServesWithTheCacheDown(t *testing.T) {
	node := startNode(t, t.TempDir())
	w := startWorkerProcess(t, node.grpc, "--speedup", "20", "--kv-events", "", "--kv-events-replay", "")
	workerComplete(t, w, workerPrompt, 2)
	before := workerMetricSum(scrapeWorker(t, w.url), "kvstrata_engine_cache_failures_total")
	node.stop()
	for i := range 3 {
		res := workerComplete(t, w, fmt.Sprintf("%d: %s", i, workerPrompt), 2)
		if res.Choices[0].FinishReason != "length" {
			t.Fatalf("with the cache down: %+v", res.Choices[0])
		}
	}
	body := scrapeWorker(t, w.url)
	if after := workerMetricSum(body, "kvstrata_engine_cache_failures_total"); after <= before {
		t.Errorf("kvstrata_engine_cache_failures_total went from %v to %v with the cache down", before, after)
	}
	if n := workerMetricSum(body, "kvstrata_engine_cache_errors_total"); n == 0 {
		t.Error("kvstrata_engine_cache_errors_total{op} counted nothing with the cache down")
	}
}

// workerEventsSubScript subscribes to a worker's KV events with libzmq, prints
// "ready", waits for a message, then asks the replay socket for every
// batch from 0 and prints each BlockStored of them (the one received live
// included) as a JSON line: its block hashes and token ids.
const workerEventsSubScript = `
import json, sys, msgpack, zmq
pub, replay = sys.argv[1], sys.argv[2]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB); sub.connect(pub); sub.setsockopt(zmq.SUBSCRIBE, b""); sub.RCVTIMEO = 30000
print("ready", flush=True)
topic, seq, payload = sub.recv_multipart()
assert len(seq) == 8
dealer = ctx.socket(zmq.DEALER); dealer.connect(replay); dealer.RCVTIMEO = 30000
dealer.send_multipart([b"", (0).to_bytes(8, "big")])
while True:
    empty, seq, payload = dealer.recv_multipart()
    if int.from_bytes(seq, "big", signed=True) == -1:
        break
    ts, events, rank = msgpack.unpackb(payload, raw=False)
    for ev in events:
        if ev[0] == "BlockStored":
            print(json.dumps({"hashes": ev[1], "tokens": ev[3], "block_size": ev[4], "medium": ev[6]}), flush=True)
`

func TestPythonSubscriberDecodesAWorkersBlockStored(t *testing.T) {
	py := "python3"
	if exec.Command(py, "-c", "import zmq, msgpack").Run() != nil {
		py = "/usr/bin/python3"
		if exec.Command(py, "-c", "import zmq, msgpack").Run() != nil {
			t.Skip("python3-zmq and python3-msgpack are not installed: skipping the Python subscriber test")
		}
	}
	w := startWorkerProcess(t, "", "--speedup", "20")
	cmd := exec.Command(py, "-c", workerEventsSubScript, w.events, w.replay)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("the subscriber did not start: %s", stderr.String())
	}
	prompt := make([]int64, 40) // two full blocks and a partial one
	for i := range prompt {
		prompt[i] = int64(1000 + 7*i)
	}
	post := func(p []int64) {
		body, _ := json.Marshal(map[string]any{"prompt": p, "max_tokens": 1})
		resp, err := http.Post(w.url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return
		}
		resp.Body.Close()
	}
	post(prompt)
	// A subscription takes a moment to reach the publisher: new prompts
	// make new events until the subscriber has heard one.
	done := make(chan struct{})
	go func() {
		for i := int64(0); ; i++ {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			post(slices.Repeat([]int64{5000 + i}, 16))
		}
	}()
	type stored struct {
		Hashes    []uint64 `json:"hashes"`
		Tokens    []uint32 `json:"tokens"`
		BlockSize int      `json:"block_size"`
		Medium    string   `json:"medium"`
	}
	var got []stored
	for lines.Scan() {
		var s stored
		if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
			t.Fatalf("%v: %s", err, lines.Text())
		}
		got = append(got, s)
	}
	close(done)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python3: %v\n%s", err, stderr.String())
	}
	m, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, len(prompt))
	for i, v := range prompt {
		toks[i] = uint32(v)
	}
	want := m.Layout().Namespace.Hashes(toks)
	var hashes []uint64
	var tokens []uint32
	for _, s := range got {
		if s.BlockSize != 16 || s.Medium != "GPU" {
			t.Errorf("BlockStored %+v: want block size 16, medium GPU", s)
		}
		hashes, tokens = append(hashes, s.Hashes...), append(tokens, s.Tokens...)
	}
	for i, h := range want {
		j := slices.Index(hashes, uint64(h))
		if j < 0 {
			t.Fatalf("block %d of the prompt (hash %d) is in no BlockStored the subscriber decoded: %+v", i, uint64(h), got)
		}
	}
	if !slices.Equal(tokens[:32], toks[:32]) {
		t.Errorf("the first BlockStored events carry tokens %v, want the prompt's %v", tokens[:32], toks[:32])
	}
}

// freePortRun returns a base port from which n ports are free.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for range 100 {
		_, p, _ := net.SplitHostPort(freeport.Addr(t))
		base, _ := strconv.Atoi(p)
		free := true
		for i := 1; i < n && free; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
			if err != nil {
				free = false
				continue
			}
			l.Close()
		}
		if free {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

func TestUpRunsACacheNodeAndTwoWorkersAndStopsCleanly(t *testing.T) {
	httpBase, eventsBase := freePortRun(t, 2), freePortRun(t, 4)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	fe := freeport.Addr(t)
	p := &proc{t: t, dir: t.TempDir()}
	p.args = []string{"up", "--workers", "2", "--http-port", strconv.Itoa(httpBase), "--kv-events-port", strconv.Itoa(eventsBase),
		"--frontend", fe, "--speedup", "20", "--num-gpu-blocks", "256", "--data-dir", p.dir, "--dram-capacity", "64MiB", "--ssd-capacity", "256MiB",
		"--listen-grpc", node[0], "--listen-data", node[1], "--listen-http", node[2], "--cluster-raft-addr", node[3], "--listen-resp", ""}
	p.launch()
	var ports []string
	for i := range 2 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(httpBase+i))
		ports = append(ports, addr)
		waitWorkerHealth(t, p, "http://"+addr)
		w := &wproc{proc: p, url: "http://" + addr}
		if res := workerComplete(t, w, "Hello from worker "+strconv.Itoa(i), 3); res.Usage.CompletionTokens != 3 {
			t.Errorf("worker %d: usage %+v", i, res.Usage)
		}
	}
	for i := range 4 {
		ports = append(ports, net.JoinHostPort("127.0.0.1", strconv.Itoa(eventsBase+i)))
	}
	ports = append(ports, node...)
	ports = append(ports, fe)
	waitWorkerHealth(t, p, "http://"+fe)
	log := p.log.String()
	for _, want := range []string{"msg=\"kvstrata serving\"", "grpc=" + node[0], "msg=\"worker serving\" worker=" + ports[0],
		"msg=\"frontend serving\" http=" + fe,
		"msg=\"worker serving\" worker=" + ports[1], fmt.Sprintf("kv_events=tcp://127.0.0.1:%d", eventsBase+2)} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %s:\n%s", want, log)
		}
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("up exited with %v after SIGINT:\n%s", err, p.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("up still running 30s after SIGINT:\n%s", p.log)
	}
	for _, addr := range ports {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("port %s is still taken after up exited: %v", addr, err)
			continue
		}
		l.Close()
	}
}

// With --kv-events-port 0 no worker publishes events: two workers do not
// both bind the default events port.
func TestUpWithoutKVEventsRunsEveryWorker(t *testing.T) {
	httpBase := freePortRun(t, 2)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	p := &proc{t: t, dir: t.TempDir()}
	p.args = []string{"up", "--workers", "2", "--http-port", strconv.Itoa(httpBase), "--kv-events-port", "0", "--frontend", "",
		"--speedup", "20", "--num-gpu-blocks", "256", "--data-dir", p.dir, "--dram-capacity", "64MiB", "--ssd-capacity", "256MiB",
		"--listen-grpc", node[0], "--listen-data", node[1], "--listen-http", node[2], "--cluster-raft-addr", node[3], "--listen-resp", ""}
	p.launch()
	defer p.stop()
	for i := range 2 {
		waitWorkerHealth(t, p, "http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(httpBase+i)))
	}
	if log := p.log.String(); strings.Contains(log, "kv_events=tcp://") {
		t.Errorf("a worker publishes KV events under --kv-events-port 0:\n%s", log)
	}
}

func TestWorkerAndUpBadFlagsExitTwoWithEveryProblem(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"worker", "--role", "router", "--speedup", "fast", "--model", "llama", "--listen", "nowhere", "--log-format", "xml"},
			[]string{`Role "router" is unknown`, `--speedup "fast"`, `Model "llama" is unknown`, `Listen: "nowhere" is not host:port`, `--log-format "xml"`}},
		{[]string{"worker", "--role", "prefill", "--cache", ""}, []string{"Role prefill needs a Cache"}},
		{[]string{"worker", "extra"}, []string{"worker takes no arguments"}},
		{[]string{"worker", "--no-such-flag"}, []string{"unknown flag: --no-such-flag"}},
		{[]string{"up", "--prefill", "1", "--workers", "3", "--dram-capacity", "lots", "--model", "llama"},
			[]string{"--prefill 1 --decode 0: a disaggregated set needs both", "--workers with --prefill/--decode",
				`dram.capacity: size "lots"`}},
		{[]string{"up", "--http-port", "65535", "--workers", "2", "--model", "llama"},
			[]string{"--http-port 65535: 2 workers need ports 65535 to 65536", `Model "llama" is unknown`}},
	} {
		usageErrorSays(t, c.args, c.want...)
	}
}

// A prefill worker serves every request as the prefill half of a
// disaggregated one; the decode worker given its kv_transfer_params
// onboards the prompt's blocks from the cache.
func TestPrefillAndDecodeRolesHandOffThroughTheCache(t *testing.T) {
	node := startNode(t, t.TempDir())
	pre := startWorkerProcess(t, node.grpc, "--role", "prefill", "--speedup", "20", "--kv-events", "", "--kv-events-replay", "")
	dec := startWorkerProcess(t, node.grpc, "--role", "decode", "--speedup", "20", "--kv-events", "", "--kv-events-replay", "")
	type usage struct {
		PromptTokens  int `json:"prompt_tokens"`
		CachedDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	type response struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
		Usage            usage           `json:"usage"`
		Choices          []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	call := func(w *wproc, req map[string]any) response {
		t.Helper()
		body, _ := json.Marshal(req)
		resp, err := http.Post(w.url+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", w.url, resp.StatusCode, b)
		}
		var r response
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	// No kv_transfer_params: the prefill role adds do_remote_decode.
	p := call(pre, map[string]any{"prompt": workerPrompt, "max_tokens": 1})
	var params map[string]any
	if err := json.Unmarshal(p.KVTransferParams, &params); err != nil || params["do_remote_prefill"] != true {
		t.Fatalf("the prefill worker's kv_transfer_params: %s (%v)", p.KVTransferParams, err)
	}
	full := p.Usage.PromptTokens / 16
	if hs, _ := params["kvstrata_block_hashes"].([]any); len(hs) != full {
		t.Fatalf("the params name %d blocks, the prompt has %d full ones: %s", len(hs), full, p.KVTransferParams)
	}
	d := call(dec, map[string]any{"prompt": workerPrompt, "max_tokens": 3, "kv_transfer_params": params})
	if d.Usage.CachedDetails.CachedTokens != full*16 || d.Choices[0].FinishReason != "length" {
		t.Errorf("the decode worker: usage %+v, finish %q; want the %d tokens of the prefilled blocks onboarded", d.Usage, d.Choices[0].FinishReason, full*16)
	}
	if n := workerMetricSum(scrapeWorker(t, pre.url), "kvstrata_engine_stored_blocks_total"); n != float64(full) {
		t.Errorf("the prefill worker stored %v blocks, want %d", n, full)
	}
	for _, c := range []struct {
		w    *wproc
		role string
	}{{pre, "prefill"}, {dec, "decode"}} {
		if want := `role="` + c.role + `"} 1`; !strings.Contains(scrapeWorker(t, c.w.url), want) {
			t.Errorf("%s: kvstrata_worker_info lacks %s", c.w.url, want)
		}
	}
}

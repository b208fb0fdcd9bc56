package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeWorker streams max_tokens one-token chunks then usage, as kvstrata's
// workers do, reporting half of each prompt as cached: enough to check the
// report's sums.
func fakeWorker(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		var req struct {
			Prompt    []uint32 `json:"prompt"`
			MaxTokens int      `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		served.Add(1)
		cached := len(req.Prompt) / 2
		w.Header().Set("Content-Type", "text/event-stream")
		for range req.MaxTokens {
			fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t\"}]}\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			len(req.Prompt), req.MaxTokens, cached)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, &served
}

// replayTrace has three requests of 600, 1000 and 100 tokens.
const replayTrace = `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 5, "input_length": 1000, "output_length": 2, "hash_ids": [0, 2]}
{"timestamp": 9, "input_length": 100, "output_length": 4, "hash_ids": [0]}
`

func TestReplayReportsAsJSONWithStableFieldNames(t *testing.T) {
	srv, served := fakeWorker(t)
	path := writeTrace(t, replayTrace)
	code, out, stderr := run(t, "replay", path, "--target", srv.URL, "--speedup", "1000", "-o", "json")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	for field, want := range map[string]float64{
		"requests": 3, "sent": 3, "completed": 3, "failed": 0, "speedup": 1000,
		"prompt_tokens": 1700, "cached_tokens": 300 + 500 + 50, "output_tokens": 9, "expected_output_tokens": 9,
	} {
		if rep[field] != want {
			t.Errorf("%s = %v, want %v", field, rep[field], want)
		}
	}
	if got := rep["prefix_hit_rate"].(float64); got != 850.0/1700 {
		t.Errorf("prefix_hit_rate = %v, want %v", got, 850.0/1700)
	}
	for _, lat := range []string{"ttft_s", "itl_s", "e2e_s"} {
		l, ok := rep[lat].(map[string]any)
		if !ok {
			t.Fatalf("no %s in %s", lat, out)
		}
		for _, q := range []string{"mean", "p50", "p90", "p99", "max", "count"} {
			if _, ok := l[q]; !ok {
				t.Errorf("%s has no %s", lat, q)
			}
		}
	}
	if n := rep["itl_s"].(map[string]any)["count"]; n != float64(2+1+3) {
		t.Errorf("%v inter-token latencies, want 6: output_length-1 per request", n)
	}
	if served.Load() != 3 {
		t.Errorf("the target served %d requests, want 3", served.Load())
	}
}

func TestReplayPrintsATableAndCutsTheTrace(t *testing.T) {
	srv, served := fakeWorker(t)
	path := writeTrace(t, replayTrace)
	code, out, stderr := run(t, "replay", path, "--target", srv.URL, "--speedup", "1000", "--max-requests", "2")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	for _, want := range []string{"small.jsonl: 2 requests against " + srv.URL, "TTFT", "ITL", "E2E",
		"2 sent, 2 completed, 0 failed", "prefix hits", "errors none"} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("the table does not say %q:\n%s", want, out)
		}
	}
	if served.Load() != 2 {
		t.Errorf("served %d, want 2 (--max-requests 2)", served.Load())
	}
	code, _, _ = run(t, "replay", path, "--target", srv.URL, "--speedup", "1000", "--duration", "6ms")
	if code != exitOK || served.Load() != 4 {
		t.Errorf("--duration 6ms: status %d, served %d in all; want 0 and 2 more (timestamps 0 and 5)", code, served.Load())
	}
}

func TestReplayFailsWhenRequestsFailAndSaysHow(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no room", http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	path := writeTrace(t, replayTrace)
	code, out, stderr := run(t, "replay", path, "--target", busy.URL, "--speedup", "1000")
	wantFailure(t, code, stderr, exitFailure, "3 of 3 requests failed; first: http_503")
	if !strings.Contains(out, "http_503 3") {
		t.Errorf("the report does not count the errors by kind:\n%s", out)
	}
}

func TestReplayRefusesBadInput(t *testing.T) {
	good := writeTrace(t, replayTrace)
	malformed := writeTrace(t, replayTrace+`{"timestamp": 1, "input_length": "many"}`+"\n")
	short := writeTrace(t, `{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [0]}`+"\n")
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{good}, exitUsage, "--target is required"},
		{[]string{good, "--target", "localhost:8000"}, exitUsage, `--target: target "localhost:8000" is not an http:// or https:// URL`},
		{[]string{good, "--target", "http://127.0.0.1:1", "--speedup", "0"}, exitUsage, "--speedup is 0, must be > 0"},
		{[]string{good, "--target", "http://127.0.0.1:1", "--speedup", "-2", "--concurrency", "0"}, exitUsage, "--speedup is -2, must be > 0; --concurrency is 0"},
		{[]string{"--target", "http://127.0.0.1:1"}, exitUsage, "replay takes one TRACE file, got 0 arguments"},
		{[]string{good + ".missing", "--target", "http://127.0.0.1:1"}, exitFailure, "no such file"},
		{[]string{malformed, "--target", "http://127.0.0.1:1"}, exitFailure, "small.jsonl:4: input_length"},
		{[]string{short, "--target", "http://127.0.0.1:1"}, exitFailure, "request 1: replay: bad request in trace: input_length 2000 needs 4 hash ids"},
	} {
		code, _, stderr := run(t, append([]string{"replay"}, c.args...)...)
		wantFailure(t, code, stderr, c.code, c.msg)
	}
}

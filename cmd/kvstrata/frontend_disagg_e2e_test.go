package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/internal/freeport"
)

// Disaggregated serving through `kvstrata frontend`, with real processes: a
// cache node, a prefill and two decode `kvstrata worker --model tiny`, an
// aggregated one for reference, and the frontend over the prefill and
// decode workers.

// routedRequests is the frontend's requests that took route, in a
// scrapeWorker of its /metrics.
func routedRequests(body, route string) float64 {
	re := regexp.MustCompile(`(?m)^kvstrata_frontend_requests_total\{[^}]*route="` + regexp.QuoteMeta(route) + `"[^}]*\} (\S+)$`)
	var sum float64
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// TestFrontendServesDisaggregated: a long prompt streamed through the
// frontend is prefilled on the prefill worker and decoded on a decode
// worker, token for token the aggregated worker's completion; a short one
// is prefilled on the decode worker (route local, as the metrics say); and
// a decode worker killed with SIGKILL mid-stream is replaced by the other,
// the stream completing with the aggregated worker's text all the same.
func TestFrontendServesDisaggregated(t *testing.T) {
	node := startNode(t, t.TempDir())
	agg := startTiny(t, "aggregated", node.grpc)
	pre := startTiny(t, "prefill", node.grpc)
	decs := []*wproc{startTiny(t, "decode", node.grpc), startTiny(t, "decode", node.grpc)}
	args := []string{"--model", "tiny", "--disagg-min-uncached-tokens", "32"}
	for i, w := range append([]*wproc{pre}, decs...) {
		role := "decode"
		if i == 0 {
			role = "prefill"
		}
		args = append(args, "--worker", fmt.Sprintf("%s,events=%s,replay=%s,role=%s", w.url, w.events, w.replay, role))
	}
	fe, url := startFrontendProcess(t, node.grpc, nil, args...)
	cl := frontendSDK(url)

	const text = "Disaggregated serving splits the prompt's prefill from the decode: one worker computes " +
		"the keys and values of every token, kvstrata keeps the blocks, and another worker loads them and " +
		"generates the answer, token by token, while the first is already busy with the next prompt."
	// reference is the aggregated worker's greedy completion of prompt;
	// asked after the frontend's run, whose blocks it then finds cached.
	reference := func(prompt string, maxTokens int) string {
		t.Helper()
		c := postCompletion(t, agg, fmt.Sprintf(`{"model": "kvstrata-tiny", "prompt": %q, "max_tokens": %d, "temperature": 0, "ignore_eos": true}`, prompt, maxTokens))
		return c.Choices[0].Text
	}

	long := "1. " + text
	got := streamCompletion(cl, "kvstrata-tiny", long, 12, nil)
	if got.err != nil || got.finish != "length" || got.completion != 12 {
		t.Fatalf("a long prompt streamed through the frontend: %+v\n%s", got, fe.log)
	}
	if want := reference(long, 12); got.text != want {
		t.Errorf("disaggregated: %q; the aggregated worker: %q", got.text, want)
	}
	m := scrapeWorker(t, url)
	if n := routedRequests(m, "disaggregated"); n != 1 {
		t.Errorf("%v requests took the disaggregated route, want 1", n)
	}
	if n := workerMetricSum(scrapeWorker(t, pre.url), "vllm:request_success_total"); n != 1 {
		t.Errorf("the prefill worker served %v requests, want the long prompt's prefill", n)
	}

	short := streamCompletion(cl, "kvstrata-tiny", "Hello, decode worker", 4, nil)
	if short.err != nil || short.completion != 4 {
		t.Fatalf("a short prompt: %+v", short)
	}
	if n := routedRequests(scrapeWorker(t, url), "local"); n != 1 {
		t.Errorf("%v requests took the local route, want the short one", n)
	}
	if n := workerMetricSum(scrapeWorker(t, pre.url), "vllm:request_success_total"); n != 1 {
		t.Errorf("the prefill worker served %v requests; the short prompt should not have reached it", n)
	}

	// The killed decode worker is the one running the request at its first chunk.
	const maxTokens = 48
	killed := -1
	moved := streamCompletion(cl, "kvstrata-tiny", "2. "+text, maxTokens, func() {
		for i, w := range decs {
			if workerMetricSum(scrapeWorker(t, w.url), "vllm:num_requests_running") > 0 {
				killed = i
				w.kill()
				return
			}
		}
	})
	if killed < 0 {
		t.Fatal("no decode worker was running the request at its first chunk")
	}
	if moved.err != nil || moved.finish != "length" || moved.completion != maxTokens {
		t.Fatalf("after a decode worker was killed mid-stream: %+v\n%s", moved, fe.log)
	}
	if want := reference("2. "+text, maxTokens); moved.text != want {
		t.Errorf("after the kill: %q; the aggregated worker: %q", moved.text, want)
	}
	m = scrapeWorker(t, url)
	if n := workerMetricSum(m, "kvstrata_frontend_migrations_total"); n < 1 {
		t.Errorf("the frontend counted %v migrations after a decode worker was killed mid-stream", n)
	}
	if n := routedRequests(m, "disaggregated"); n != 2 {
		t.Errorf("%v requests took the disaggregated route, want 2", n)
	}
}

// TestFrontendBadRolesExitTwo: a worker list that is not disaggregated
// sense, or a role that does not exist, is a usage error naming it.
func TestFrontendBadRolesExitTwo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--worker", "http://127.0.0.1:1,role=prefill"}, "1 prefill workers but no decode worker"},
		{[]string{"--worker", "http://127.0.0.1:1,role=decode", "--worker", "http://127.0.0.1:2"}, "1 aggregated workers listed with prefill or decode ones"},
		{[]string{"--worker", "http://127.0.0.1:1,role=encode"}, `has role "encode"`},
		{[]string{"--worker", "http://127.0.0.1:1", "--disagg-min-uncached-tokens", "many"}, `--disagg-min-uncached-tokens "many"`},
	} {
		usageErrorSays(t, append([]string{"frontend"}, c.args...), c.want)
	}
}

// TestUpServesADisaggregatedSetThroughItsFrontend: `kvstrata up --prefill
// 1 --decode 1` starts its frontend too, which serves a long prompt
// disaggregated (prefilled on the prefill worker, decoded on the decode
// worker) and a short one on the decode worker alone.
func TestUpServesADisaggregatedSetThroughItsFrontend(t *testing.T) {
	httpBase, eventsBase := freePortRun(t, 2), freePortRun(t, 4)
	fe := freeport.Addr(t)
	node := []string{freeport.Addr(t), freeport.Addr(t), freeport.Addr(t), freeport.Addr(t)}
	p := &proc{t: t, dir: t.TempDir()}
	p.args = []string{"up", "--prefill", "1", "--decode", "1", "--http-port", strconv.Itoa(httpBase),
		"--kv-events-port", strconv.Itoa(eventsBase), "--frontend", fe, "--speedup", "20", "--num-gpu-blocks", "512",
		"--data-dir", p.dir, "--dram-capacity", "64MiB", "--ssd-capacity", "256MiB", "--listen-grpc", node[0],
		"--listen-data", node[1], "--listen-http", node[2], "--cluster-raft-addr", node[3], "--listen-resp", ""}
	p.launch()
	url := "http://" + fe
	waitWorkerHealth(t, p, url)
	cl := frontendSDK(url)
	// Over the frontend's default 1000 uncached tokens: disaggregated.
	long := strings.Repeat("A prefill worker computes the prompt, the cache keeps it, a decode worker streams. ", 80)
	if res := streamCompletion(cl, "kvstrata-sim", long, 6, nil); res.err != nil || res.finish != "length" || res.completion != 6 {
		t.Fatalf("a long prompt through up's frontend: %+v\n%s", res, p.log)
	}
	if res := streamCompletion(cl, "kvstrata-sim", "A short one.", 6, nil); res.err != nil || res.completion != 6 {
		t.Fatalf("a short prompt through up's frontend: %+v\n%s", res, p.log)
	}
	m := scrapeWorker(t, url)
	if n := routedRequests(m, "disaggregated"); n != 1 {
		t.Errorf("%v requests took the disaggregated route, want the long one", n)
	}
	if n := routedRequests(m, "local"); n != 1 {
		t.Errorf("%v requests took the local route, want the short one", n)
	}
}

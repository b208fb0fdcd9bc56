package frontend

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/router/policy"
)

// decisions are r's routing decisions so far, per worker.
func decisions(r *Router, ws []*testWorker) []float64 {
	var n []float64
	for _, w := range ws {
		var sum float64
		for _, p := range policy.Policies() {
			sum += testutil.ToFloat64(r.m.decisions.WithLabelValues(w.spec.URL, p.String()))
		}
		n = append(n, sum)
	}
	return n
}

// routedTo is the worker r routed run's one request to: the one whose
// decisions grew.
func routedTo(t *testing.T, r *Router, ws []*testWorker, run func()) int {
	t.Helper()
	before := decisions(r, ws)
	run()
	after := decisions(r, ws)
	got := -1
	for i := range ws {
		if after[i] != before[i] {
			if got >= 0 {
				t.Fatalf("one request was routed twice: %v → %v", before, after)
			}
			got = i
		}
	}
	if got < 0 {
		t.Fatal("the request was routed nowhere")
	}
	return got
}

// TestSharedPrefixGoesToItsHolder: under kv-tiered (with a cache holding
// the blocks too) and kv-hbm, a request whose prompt shares a prefix with
// an earlier one goes to the worker that served it, as its KV events tell
// the router — for each of several prefixes, so that luck cannot pass it.
func TestSharedPrefixGoesToItsHolder(t *testing.T) {
	for _, pol := range []policy.Policy{policy.KVTiered, policy.KVHBM} {
		t.Run(pol.String(), func(t *testing.T) {
			cache := ""
			if pol == policy.KVTiered {
				cache = nodetest.Start(t, nodetest.Options{}).Addr
			}
			ws := startWorkers(t, 2, "sim", cache)
			r, _ := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), Cache: cache, Policy: policy.Config{Policy: pol}})
			for seed := range 6 {
				prefix := ids(seed, 256)
				var first int
				first = routedTo(t, r, ws, func() {
					res := generate(t, r, sched.Request{Prompt: prefix, MaxTokens: 4, IgnoreEOS: true}, nil)
					if res.err != nil || len(res.tokens) != 4 {
						t.Fatalf("first request: %d tokens, %v", len(res.tokens), res.err)
					}
				})
				hashes := namespace(ws).Hashes(prefix)
				waitFor(t, "the index learns the first request's blocks", func() bool {
					for _, m := range r.Index().Overlap(r.ns, hashes, nil) {
						if m.Worker == r.workerSet().list[first].id && m.Blocks == len(hashes) {
							return true
						}
					}
					return false
				})
				second := routedTo(t, r, ws, func() {
					res := generate(t, r, sched.Request{Prompt: append(slices.Clone(prefix), ids(100+seed, 40)...), MaxTokens: 4, IgnoreEOS: true}, nil)
					if res.err != nil || len(res.tokens) != 4 {
						t.Fatalf("second request: %d tokens, %v", len(res.tokens), res.err)
					}
					if res.usage.CachedTokens < len(prefix) {
						t.Errorf("second request found %d cached tokens, want its %d-token prefix", res.usage.CachedTokens, len(prefix))
					}
				})
				if second != first {
					t.Fatalf("prefix %d: first request on worker %d, the second sharing its prefix on %d", seed, first, second)
				}
			}
		})
	}
}

// TestWorkerDyingMidStreamIsReplaced: a worker stopped in the middle of a
// stream (its connections cut) leaves the candidates, and the request
// continues on the other worker with the prompt plus what was produced:
// the same number of tokens in all, one migration counted — and with tiny
// (greedy), the very tokens of an undisturbed run.
func TestWorkerDyingMidStreamIsReplaced(t *testing.T) {
	for _, backend := range []string{"sim", "tiny"} {
		t.Run(backend, func(t *testing.T) {
			cache := nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20}).Addr
			ws := startWorkers(t, 2, backend, cache)
			r, _ := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), Cache: cache})
			const maxTokens = 120
			req := sched.Request{Prompt: ids(1, 100), MaxTokens: maxTokens, IgnoreEOS: true}
			undisturbed := generate(t, r, req, nil)
			if undisturbed.err != nil || len(undisturbed.tokens) != maxTokens {
				t.Fatalf("undisturbed run: %d tokens, %v", len(undisturbed.tokens), undisturbed.err)
			}
			killed := -1
			res := generate(t, r, req, func(toks []uint32) {
				if killed >= 0 || len(toks) < 10 {
					return
				}
				for i, w := range ws {
					if l := r.Load(w.spec.URL); l.Decoding+l.Prefilling > 0 {
						killed = i
						w.stop(0) // cut at once
						return
					}
				}
			})
			if killed < 0 {
				t.Fatal("no worker was seen serving the request")
			}
			if res.err != nil || res.finish != sched.FinishLength || len(res.tokens) != maxTokens {
				t.Fatalf("after the kill: %d tokens, finish %q, %v; want %d, length", len(res.tokens), res.finish, res.err, maxTokens)
			}
			if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(causeBroken)); n != 1 {
				t.Errorf("%v broken-stream migrations counted, want 1", n)
			}
			if r.Healthy(ws[killed].spec.URL) {
				t.Error("the stopped worker is still a candidate")
			}
			if backend == "tiny" && !slices.Equal(res.tokens, undisturbed.tokens) {
				t.Fatalf("tokens after the move differ from the undisturbed run's:\n%v\n%v", res.tokens, undisturbed.tokens)
			}
		})
	}
}

// TestRefusedWorkerLeavesTheCandidates: a listed worker that refuses
// connections costs no request — each moves to the live worker — and is
// out of the candidates after the first refusal.
func TestRefusedWorkerLeavesTheCandidates(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	dead := WorkerSpec{URL: "http://" + freeport.Addr(t)} // nothing listens
	r, _ := newRouter(t, Config{Workers: []WorkerSpec{dead, ws[0].spec}, Namespace: namespace(ws),
		Policy: policy.Config{Policy: policy.RoundRobin}, HealthInterval: time.Hour})
	for i := range 4 {
		res := generate(t, r, sched.Request{Prompt: ids(i, 20), MaxTokens: 3, IgnoreEOS: true}, nil)
		if res.err != nil || len(res.tokens) != 3 {
			t.Fatalf("request %d: %d tokens, %v", i, len(res.tokens), res.err)
		}
	}
	if r.Healthy(dead.URL) {
		t.Fatal("a worker that refused a connection is still a candidate")
	}
	if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(causeRefused)); n != 1 {
		t.Fatalf("%v refused migrations, want 1: the refused worker is tried once", n)
	}
}

// TestUnhealthyWorkerComesBack: a worker whose /health fails leaves the
// candidates without a request failing on it, and comes back once it
// answers again; the Router is Ready while some worker is a candidate.
func TestUnhealthyWorkerComesBack(t *testing.T) {
	var mu sync.Mutex
	sick := true
	srv := newHealthServer(t, func() bool { mu.Lock(); defer mu.Unlock(); return !sick })
	ws := startWorkers(t, 1, "sim", "")
	r, _ := newRouter(t, Config{Workers: []WorkerSpec{{URL: srv}, ws[0].spec}, Namespace: namespace(ws),
		HealthInterval: 20 * time.Millisecond, ProbeMax: 40 * time.Millisecond})
	waitFor(t, "the sick worker leaves the candidates", func() bool { return !r.Healthy(srv) })
	if err := r.Ready(); err != nil {
		t.Fatalf("Ready with a healthy worker left: %v", err)
	}
	ws[0].stop(0)
	waitFor(t, "the stopped worker leaves the candidates", func() bool { return !r.Healthy(ws[0].spec.URL) })
	if err := r.Ready(); !errors.Is(err, ErrNoWorkers) {
		t.Fatalf("Ready with no healthy worker: %v, want ErrNoWorkers", err)
	}
	mu.Lock()
	sick = false
	mu.Unlock()
	waitFor(t, "the healed worker comes back", func() bool { return r.Healthy(srv) })
	if err := r.Ready(); err != nil {
		t.Fatalf("Ready once a worker is back: %v", err)
	}
}

// TestAllBusyIsAnswered503: with its one worker busy, a request waits in
// the queue and, past QueueWait, is answered 503 with Retry-After; past
// the queue's size, at once.
func TestAllBusyIsAnswered503(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	r, reg := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), WorkerBlocks: 1,
		Policy: policy.Config{BusyBlockFraction: 0.5}, QueueSize: 1, QueueWait: 300 * time.Millisecond})
	ts := serveAPI(t, r, reg, nil)
	long := make(chan result, 1)
	go func() {
		long <- generate(t, r, sched.Request{Prompt: ids(1, 20), MaxTokens: 2000, IgnoreEOS: true}, nil)
	}()
	waitFor(t, "the long request is running", func() bool { return r.Load(ws[0].spec.URL).Blocks > 0 })
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": [1, 2, 3], "max_tokens": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a request while every worker is busy got %s, Retry-After %q; want 503 with Retry-After",
			resp.Status, resp.Header.Get("Retry-After"))
	}
	if _, err := r.Generate(t.Context(), sched.Request{Prompt: ids(2, 5), MaxTokens: 1}); !errors.Is(err, sched.ErrOverloaded) {
		t.Fatalf("Generate while all busy: %v, want sched.ErrOverloaded", err)
	}
	ws[0].stop(0)
	<-long
}

// TestQueuedRequestRunsWhenAWorkerFrees: a request that finds every worker
// busy waits in the queue (its depth shows it) and runs once the busy
// request ends.
func TestQueuedRequestRunsWhenAWorkerFrees(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	r, _ := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), WorkerBlocks: 1,
		Policy: policy.Config{BusyBlockFraction: 0.5}, QueueSize: 4, QueueWait: time.Minute})
	first := make(chan result, 1)
	go func() {
		first <- generate(t, r, sched.Request{Prompt: ids(1, 20), MaxTokens: 200, IgnoreEOS: true}, nil)
	}()
	waitFor(t, "the first request is running", func() bool { return r.Load(ws[0].spec.URL).Blocks > 0 })
	second := make(chan result, 1)
	go func() {
		second <- generate(t, r, sched.Request{Prompt: ids(2, 20), MaxTokens: 5, IgnoreEOS: true}, nil)
	}()
	waitFor(t, "the second request waits in the queue", func() bool { return testutil.ToFloat64(r.m.queue) == 1 })
	for i, ch := range []chan result{first, second} {
		if res := <-ch; res.err != nil || res.finish != sched.FinishLength {
			t.Fatalf("request %d: %d tokens, finish %q, %v", i+1, len(res.tokens), res.finish, res.err)
		}
	}
	if d := testutil.ToFloat64(r.m.queue); d != 0 {
		t.Fatalf("queue depth %v after both ran", d)
	}
}

func TestConfigValidateNamesEveryProblem(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	cfg := Config{Workers: []WorkerSpec{{URL: "ftp://x"}, ws[0].spec, ws[0].spec, {URL: "http://127.0.0.1:1", Replay: "tcp://127.0.0.1:2"}},
		QueueSize: -1, WorkerBlocks: -2}
	_, err := New(cfg)
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("New: %v, want ErrBadConfig", err)
	}
	for _, want := range []string{`"ftp://x" is not http://host:port`, "is listed twice", "replay endpoint but no events",
		"namespace:", "queue size is -1", "worker blocks is -2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	if _, err := New(Config{}); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "no workers") {
		t.Errorf("an empty config: %v", err)
	}
}

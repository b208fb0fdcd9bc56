package frontend

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/openai"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
	engine "github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

var quiet = slog.New(slog.DiscardHandler)

// testWorker is an in-process worker and its spec.
type testWorker struct {
	*engine.Worker
	spec    WorkerSpec
	stopped bool
}

// startWorkers starts n in-process workers of backend (sim at a speedup,
// or tiny) with KV events, using the cache node at cache ("" none).
func startWorkers(t *testing.T, n int, backend, cache string) []*testWorker {
	t.Helper()
	var ws []*testWorker
	for range n {
		cfg := engine.Config{
			Model: backend, Speedup: 4, Listen: "127.0.0.1:0", Cache: cache, Blocks: 1024,
			KVEvents: "tcp://" + freeport.Addr(t), KVEventsReplay: "tcp://" + freeport.Addr(t), Logger: quiet,
		}
		w, err := engine.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		tw := &testWorker{Worker: w, spec: WorkerSpec{URL: "http://" + w.Addr(), Events: cfg.KVEvents, Replay: cfg.KVEventsReplay}}
		t.Cleanup(func() { tw.stop(10 * time.Second) })
		ws = append(ws, tw)
	}
	return ws
}

// stop stops the worker, cutting requests in flight after grace.
func (w *testWorker) stop(grace time.Duration) {
	if w.stopped {
		return
	}
	w.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	w.Stop(ctx)
}

func specs(ws []*testWorker) []WorkerSpec {
	var s []WorkerSpec
	for _, w := range ws {
		s = append(s, w.spec)
	}
	return s
}

// namespace is the workers' block namespace.
func namespace(ws []*testWorker) index.Namespace { return ws[0].Model().Layout().Namespace }

// newRouter starts a Router over cfg with a fresh registry.
func newRouter(t *testing.T, cfg Config) (*Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Logger = quiet
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, reg
}

// serveAPI serves the OpenAI API over r, as `kvstrata frontend` does.
func serveAPI(t *testing.T, r *Router, reg *prometheus.Registry, stop []uint32) *httptest.Server {
	t.Helper()
	tok, err := tokenizer.O200k()
	if err != nil {
		t.Fatal(err)
	}
	api, err := openai.New(openai.Config{Engine: r, Tokenizer: tok, ModelName: "kvstrata-frontend-test", ContextLen: 4096,
		StopTokens: stop, Gatherer: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	return ts
}

// result is a request's outputs gathered.
type result struct {
	tokens []uint32
	finish sched.FinishReason
	usage  sched.Usage
	err    error
}

// generate runs req through r to its end; each is called with the tokens
// so far after every Output.
func generate(t *testing.T, r *Router, req sched.Request, each func([]uint32)) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second) // tiny under -race on a loaded CPU is slow
	defer cancel()
	out, err := r.Generate(ctx, req)
	if err != nil {
		return result{err: err}
	}
	var res result
	for o := range out {
		res.tokens = append(res.tokens, o.Tokens...)
		if each != nil {
			each(res.tokens)
		}
		if o.Finish != "" {
			res.finish, res.usage, res.err = o.Finish, o.Usage, o.Err
		}
	}
	return res
}

// waitFor polls cond until it holds or 30 s pass: a bound for a stuck
// condition, generous enough for a loaded machine under -race.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ids is a prompt of n token ids, distinct for each seed.
func ids(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(1000 + seed*1000 + i)
	}
	return p
}

// newHealthServer serves /health answering 200 while ok(), else 503.
func newHealthServer(t *testing.T, ok func() bool) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ok() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

package frontend

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// fakeWorker is an OpenAI-compatible worker that streams the token ids
// toks (one a chunk, after delay), then either finishes (finish != "") or
// stalls: it keeps the connection open and sends nothing more, and from
// then on, if frozen, its /health does not answer either, as a stopped
// process.
type fakeWorker struct {
	url     string
	frozen  bool
	stalled atomic.Bool
}

func startFakeWorker(t *testing.T, delay time.Duration, toks []uint32, finish string, frozen bool) *fakeWorker {
	t.Helper()
	f := &fakeWorker{frozen: frozen}
	stop := make(chan struct{})
	hang := func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if f.frozen && f.stalled.Load() {
			hang(r)
		}
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(delay)
		for _, tok := range toks {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"token_ids\":[%d],\"finish_reason\":null}]}\n\n", tok)
			w.(http.Flusher).Flush()
		}
		if finish == "" {
			f.stalled.Store(true)
			hang(r)
			return
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"token_ids\":[],\"finish_reason\":%q}]}\n\ndata: [DONE]\n\n", finish)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(func() { close(stop); ts.Close() })
	f.url = ts.URL
	return f
}

// TestStalledWorkerIsLeft: a worker whose stream goes silent — before its
// first token, or after three — while its connection stays open is taken
// for stalled: once the stall timeout passes if its /health stopped
// answering too (frozen), once the stall limit passes if not (a request
// stuck in a live worker). The request moves to the other worker with the
// tokens produced and completes, the migration is counted as "stalled",
// and the silent worker is out of the candidates.
func TestStalledWorkerIsLeft(t *testing.T) {
	for _, c := range []struct {
		name           string
		toks           []uint32
		frozen         bool
		timeout, limit time.Duration
	}{
		{"frozen before its first token", nil, true, 2 * time.Second, time.Hour},
		{"frozen after three tokens", []uint32{5, 6, 7}, true, 2 * time.Second, time.Hour},
		{"stuck after three tokens in a live worker", []uint32{5, 6, 7}, false, time.Second, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := startFakeWorker(t, 0, c.toks, "", c.frozen)
			ws := startWorkers(t, 1, "sim", "")
			// Round-robin sends the first request to the first worker, the fake.
			r, _ := newRouter(t, Config{Workers: append([]WorkerSpec{{URL: fake.url}}, specs(ws)...), Namespace: namespace(ws),
				Policy: policy.Config{Policy: policy.RoundRobin}, StallTimeout: c.timeout, StallLimit: c.limit})
			const maxTokens = 20
			res := generate(t, r, sched.Request{Prompt: ids(3, 64), MaxTokens: maxTokens, IgnoreEOS: true}, nil)
			if res.err != nil || res.finish != sched.FinishLength || len(res.tokens) != maxTokens {
				t.Fatalf("%d tokens, finish %q, %v; want %d, length", len(res.tokens), res.finish, res.err, maxTokens)
			}
			if !slices.Equal(res.tokens[:len(c.toks)], c.toks) {
				t.Errorf("the stream begins %v, not with the stalled worker's %v", res.tokens[:len(c.toks)], c.toks)
			}
			if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(causeStalled)); n != 1 {
				t.Errorf("%v stalled migrations counted, want 1", n)
			}
			if c.frozen && r.Healthy(fake.url) {
				t.Error("the frozen worker is still a candidate")
			}
		})
	}
}

// TestSlowFirstTokenIsNotAStall: a worker that answers its health checks
// and whose first token comes later than the stall timeout, within the
// stall limit (a long prefill), keeps the request: no migration.
func TestSlowFirstTokenIsNotAStall(t *testing.T) {
	fake := startFakeWorker(t, 3*time.Second, []uint32{1, 2, 3, 4}, "length", false)
	ns := namespace(startWorkers(t, 1, "sim", ""))
	r, _ := newRouter(t, Config{Workers: []WorkerSpec{{URL: fake.url}}, Namespace: ns,
		StallTimeout: 500 * time.Millisecond, StallLimit: time.Minute})
	res := generate(t, r, sched.Request{Prompt: ids(4, 64), MaxTokens: 4, IgnoreEOS: true}, nil)
	if res.err != nil || res.finish != sched.FinishLength || !slices.Equal(res.tokens, []uint32{1, 2, 3, 4}) {
		t.Fatalf("tokens %v, finish %q, %v; want [1 2 3 4], length", res.tokens, res.finish, res.err)
	}
	for _, cause := range []string{causeStalled, causeBroken, causeRefused} {
		if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(cause)); n != 0 {
			t.Errorf("%v %s migrations of a request whose prefill was long", n, cause)
		}
	}
}

// TestSlowClientIsNotAStall: a client that takes no token for longer than
// the stall limit holds the stream up, but the worker, whose tokens wait
// for it, is not taken for stalled: no migration, every token comes.
func TestSlowClientIsNotAStall(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	r, _ := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), StallTimeout: 500 * time.Millisecond, StallLimit: time.Second})
	const maxTokens = 100
	paused := false
	res := generate(t, r, sched.Request{Prompt: ids(5, 64), MaxTokens: maxTokens, IgnoreEOS: true}, func([]uint32) {
		if !paused {
			paused = true
			time.Sleep(3 * time.Second) // the Router's 16 outputs of buffer fill meanwhile
		}
	})
	if res.err != nil || res.finish != sched.FinishLength || len(res.tokens) != maxTokens {
		t.Fatalf("%d tokens, finish %q, %v; want %d, length", len(res.tokens), res.finish, res.err, maxTokens)
	}
	if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(causeStalled)); n != 0 {
		t.Errorf("%v stalled migrations while the client, not the worker, was slow", n)
	}
}

// BenchmarkStallGuardRead is the guard's cost on each read of a worker's
// stream once it flows (a timer re-armed per read).
func BenchmarkStallGuardRead(b *testing.B) {
	g := newStallGuard(15*time.Second, 2*time.Minute, time.Second, func() bool { return true }, func() {})
	defer g.stop()
	g.token()
	rd := g.body(zeroReader{})
	buf := make([]byte, 256) // about one SSE chunk
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		rd.Read(buf)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { return len(p), nil }

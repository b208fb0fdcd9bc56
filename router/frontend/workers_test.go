package frontend

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// TestWorkersComeAndGo: a Router over one static worker takes a second one
// added while it runs, routes to it, and stops routing to it once it is
// removed; discovery's updates leave the static worker alone.
func TestWorkersComeAndGo(t *testing.T) {
	ws := startWorkers(t, 2, "sim", "")
	r, reg := newRouter(t, Config{Workers: specs(ws[:1]), Namespace: namespace(ws), Policy: policy.Config{Policy: policy.RoundRobin}})
	added := ws[1].spec
	added.Blocks = 64
	if err := r.AddWorker(added); err != nil {
		t.Fatalf("AddWorker: %v", err)
	}
	if err := r.AddWorker(added); !errors.Is(err, ErrWorkerExists) {
		t.Fatalf("adding the worker twice: %v, want ErrWorkerExists", err)
	}
	if err := r.AddWorker(WorkerSpec{URL: "ftp://nowhere"}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("adding a worker of a bad URL: %v, want ErrBadConfig", err)
	}
	if got := r.Workers(); len(got) != 2 || got[1] != added || !r.Healthy(added.URL) {
		t.Fatalf("Workers = %+v, healthy %v; want the static worker and the added one, healthy", got, r.Healthy(added.URL))
	}
	if c := r.candidates(r.workerSet().serving, nil, nil); c[1].Capacity != 64 || c[0].Capacity != 0 {
		t.Fatalf("capacities %d and %d, want 0 (unknown) and the added worker's 64 blocks", c[0].Capacity, c[1].Capacity)
	}
	// Both workers are candidates: round-robin reaches both.
	counts := map[int]int{}
	for i := range 6 {
		got := routedTo(t, r, ws, func() {
			if res := generate(t, r, sched.Request{Prompt: ids(i, 40), MaxTokens: 2, IgnoreEOS: true}, nil); res.err != nil {
				t.Fatal(res.err)
			}
		})
		counts[got]++
	}
	if counts[1] == 0 {
		t.Fatalf("six requests over two workers went %v: none to the added one", counts)
	}

	if !r.RemoveWorker(added.URL) || r.RemoveWorker(added.URL) {
		t.Fatal("RemoveWorker: want true once, then false")
	}
	if r.Healthy(added.URL) || len(r.Workers()) != 1 {
		t.Fatalf("after removing it the worker is healthy=%v, workers %+v", r.Healthy(added.URL), r.Workers())
	}
	if n := testutil.CollectAndCount(reg, "kvstrata_frontend_worker_healthy"); n != 1 {
		t.Fatalf("%d worker health series after a removal, want 1", n)
	}
	for i := range 4 {
		if got := routedTo(t, r, ws, func() {
			if res := generate(t, r, sched.Request{Prompt: ids(10+i, 40), MaxTokens: 2, IgnoreEOS: true}, nil); res.err != nil {
				t.Fatal(res.err)
			}
		}); got != 0 {
			t.Fatalf("a request went to the removed worker")
		}
	}

	// Discovery adds and removes its own workers, never the static one.
	if err := r.setDiscovered([]WorkerSpec{ws[0].spec, ws[1].spec}); err != nil {
		t.Fatal(err)
	}
	if got := r.Workers(); len(got) != 2 || got[0] != ws[0].spec || got[1] != ws[1].spec {
		t.Fatalf("after discovering both workers: %+v", got)
	}
	if err := r.setDiscovered(nil); err != nil {
		t.Fatal(err)
	}
	if got := r.Workers(); len(got) != 1 || got[0] != ws[0].spec {
		t.Fatalf("after discovering none: %+v, want the static worker alone", got)
	}
}

func TestConfigDiscoverNeedsNoStaticWorkersButACache(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	c := Config{Namespace: namespace(ws), Discover: true}
	c.EnsureDefaults()
	if err := c.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "cache") || strings.Contains(err.Error(), "no workers") {
		t.Fatalf("Validate of discovery without a cache: %v", err)
	}
	c.Cache = "127.0.0.1:1"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate of discovery with a cache and no static worker: %v", err)
	}
}

func TestDiscoveryTakesTheWorkersOfItsNamespace(t *testing.T) {
	r := &Router{ns: 0x1234}
	for _, c := range []struct {
		rec  *pb.WorkerRecord
		want bool
	}{
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x1234, Role: "aggregated"}, true},
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x1234}, true},
		{&pb.WorkerRecord{Url: "http://a:1"}, true}, // namespace unknown
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x9999}, false},
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x1234, Role: "prefill"}, true},
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x1234, Role: "decode"}, true},
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x9999, Role: "decode"}, false},
		{&pb.WorkerRecord{Url: "http://a:1", Namespace: 0x1234, Role: "router"}, false}, // a role this Router does not know
	} {
		if got := r.serves(c.rec); got != c.want {
			t.Errorf("serves(%v) = %v, want %v", c.rec, got, c.want)
		}
	}
}

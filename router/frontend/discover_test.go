package frontend

import (
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// records are ws's worker registry records, each in its role.
func records(ws ...*testWorker) []*pb.WorkerRecord {
	var recs []*pb.WorkerRecord
	for _, w := range ws {
		recs = append(recs, &pb.WorkerRecord{Url: w.spec.URL, Events: w.spec.Events, Replay: w.spec.Replay, Role: w.spec.Role,
			Namespace: uint64(w.Model().Layout().Namespace.ID())})
	}
	return recs
}

// poolURLs are the URLs of p's workers, sorted.
func poolURLs(p *pool) []string {
	var urls []string
	if p != nil {
		for _, w := range p.workers {
			urls = append(urls, w.name)
		}
	}
	slices.Sort(urls)
	return urls
}

// TestDiscoveredPrefillAndDecodeWorkersServeDisaggregated: a Router with
// no static worker, given the registry's records of a prefill worker and
// a decode worker, serves disaggregated as a static list of them does: the
// prompt is prefilled on the prefill worker and decoded on the decode one,
// with an aggregated worker's tokens. An aggregated worker registered
// after joins the serving pool beside the decode worker (a mixed set: the
// prefill worker prefills for both), and the set goes on serving
// disaggregated.
func TestDiscoveredPrefillAndDecodeWorkersServeDisaggregated(t *testing.T) {
	d := startDisagg(t, 1)
	ns := namespace([]*testWorker{d.agg})
	// The registry is listed by the test (the cache node here has none).
	r, _ := newRouter(t, Config{Discover: true, DiscoverInterval: time.Hour, Namespace: ns, Cache: d.cache,
		DisaggMinUncached: 32, Policy: policy.Config{TieBreak: policy.TieLowestIndex}})
	stranger := &pb.WorkerRecord{Url: "http://127.0.0.1:1", Role: "router"} // a role the Router does not know
	if err := r.setDiscovered(r.discovered(append(records(d.pre, d.dec[0]), stranger))); err != nil {
		t.Fatal(err)
	}
	s := r.workerSet()
	if !slices.Equal(poolURLs(s.prefill), []string{d.pre.spec.URL}) || !slices.Equal(poolURLs(s.serving), []string{d.dec[0].spec.URL}) {
		t.Fatalf("discovered prefill pool %v, serving pool %v; want the prefill worker, the decode worker", poolURLs(s.prefill), poolURLs(s.serving))
	}
	byURL := func(a, b WorkerSpec) int { return strings.Compare(a.URL, b.URL) }
	if got, want := slices.SortedFunc(slices.Values(r.Workers()), byURL), slices.SortedFunc(slices.Values([]WorkerSpec{d.pre.spec, d.dec[0].spec}), byURL); !slices.Equal(got, want) {
		t.Fatalf("discovered %+v, want %+v", got, want)
	}

	agg, _ := newRouter(t, Config{Workers: []WorkerSpec{d.agg.spec}, Namespace: ns, Cache: d.cache})
	for i, set := range []string{"prefill and decode", "prefill, decode and aggregated"} {
		req := sched.Request{Prompt: ids(30+i, 100), MaxTokens: 8, IgnoreEOS: true}
		got := generate(t, r, req, nil) // first: the aggregated run leaves the blocks in the cache
		want := generate(t, agg, req, nil)
		if got.err != nil || want.err != nil || !slices.Equal(got.tokens, want.tokens) {
			t.Fatalf("%s, disaggregated: %v (%v); aggregated %v (%v)", set, got.tokens, got.err, want.tokens, want.err)
		}
		if n := routed(r, routeDisaggregated); n != float64(i+1) {
			t.Errorf("%s: %v requests took the disaggregated route, want %d", set, n, i+1)
		}
		if i > 0 {
			break
		}
		if err := r.setDiscovered(r.discovered(records(d.pre, d.dec[0], d.agg))); err != nil {
			t.Fatal(err)
		}
		s := r.workerSet()
		if want := slices.Sorted(slices.Values([]string{d.agg.spec.URL, d.dec[0].spec.URL})); !slices.Equal(poolURLs(s.serving), want) ||
			!slices.Equal(poolURLs(s.prefill), []string{d.pre.spec.URL}) {
			t.Fatalf("mixed set: serving pool %v, prefill pool %v", poolURLs(s.serving), poolURLs(s.prefill))
		}
	}
	idle(t, r)
}

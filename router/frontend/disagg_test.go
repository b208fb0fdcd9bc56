package frontend

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/engine/sched"
	engine "github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/router/policy"
)

// startRole starts an in-process tiny worker in role (aggregated, prefill
// or decode) with KV events, using the cache node at cache.
func startRole(t *testing.T, role, cache string) *testWorker {
	t.Helper()
	cfg := engine.Config{
		Model: "tiny", Role: role, Listen: "127.0.0.1:0", Cache: cache, Blocks: 1024,
		KVEvents: "tcp://" + freeport.Addr(t), KVEventsReplay: "tcp://" + freeport.Addr(t), Logger: quiet,
	}
	w, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	tw := &testWorker{Worker: w, spec: WorkerSpec{URL: "http://" + w.Addr(), Events: cfg.KVEvents, Replay: cfg.KVEventsReplay, Role: role}}
	t.Cleanup(func() { tw.stop(10 * time.Second) })
	return tw
}

// disaggWorkers are a cache node and tiny workers: one aggregated (the
// reference), one prefill and decodes decode workers.
type disaggWorkers struct {
	cache    string
	agg, pre *testWorker
	dec      []*testWorker
}

func startDisagg(t *testing.T, decodes int) disaggWorkers {
	t.Helper()
	d := disaggWorkers{cache: nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20}).Addr}
	d.agg = startRole(t, RoleAggregated, d.cache)
	d.pre = startRole(t, RolePrefill, d.cache)
	for range decodes {
		d.dec = append(d.dec, startRole(t, RoleDecode, d.cache))
	}
	return d
}

// routed is r's requests so far by route, over every worker and outcome.
func routed(r *Router, route string) float64 {
	var n float64
	for _, w := range r.workerSet().list {
		for _, o := range []string{"ok", "error", "cancelled"} {
			n += testutil.ToFloat64(r.m.requests.WithLabelValues(w.name, o, route))
		}
	}
	return n
}

// idle fails the test unless r tracks no load on any worker: every
// sequence of the requests that ran was ended.
func idle(t *testing.T, r *Router) {
	t.Helper()
	for _, w := range r.workerSet().list {
		if l := r.Load(w.name); l != (policy.Load{}) {
			t.Errorf("worker %s (%s) still has load %+v after every request ended", w.name, w.spec.Role, l)
		}
	}
}

// TestDisaggregatedServingMatchesAggregated: a prompt longer than the
// threshold is prefilled on the prefill worker and decoded on the decode
// worker, which onboards every full block but the last token's; the tokens
// are an aggregated worker's, greedy and sampled with a seed. A short
// prompt is prefilled on the decode worker (route local), the prefill
// worker not asked. The routes show in the metrics, and the load the
// Router tracks is back to nothing on both workers.
func TestDisaggregatedServingMatchesAggregated(t *testing.T) {
	d := startDisagg(t, 1)
	ns := namespace([]*testWorker{d.agg})
	agg, _ := newRouter(t, Config{Workers: []WorkerSpec{d.agg.spec}, Namespace: ns, Cache: d.cache})
	dis, _ := newRouter(t, Config{Workers: []WorkerSpec{d.pre.spec, d.dec[0].spec}, Namespace: ns, Cache: d.cache,
		DisaggMinUncached: 32})

	for i, s := range []sched.Sampling{{}, {Temperature: 0.8, Seed: 5}} {
		req := sched.Request{Prompt: ids(10+i, 100), MaxTokens: 12, IgnoreEOS: true, Sampling: s}
		got := generate(t, dis, req, nil) // first: the aggregated run leaves the blocks in the cache
		want := generate(t, agg, req, nil)
		if want.err != nil || got.err != nil || !slices.Equal(got.tokens, want.tokens) || got.finish != want.finish {
			t.Fatalf("sampling %+v: disaggregated %v %q (%v); aggregated %v %q (%v)", s, got.tokens, got.finish, got.err, want.tokens, want.finish, want.err)
		}
		if got.usage.CachedTokens != 96 {
			t.Errorf("sampling %+v: the decode worker found %d of 100 prompt tokens cached, want 96 (6 full blocks onboarded)", s, got.usage.CachedTokens)
		}
	}
	if n := routed(dis, routeDisaggregated); n != 2 {
		t.Errorf("%v requests took the disaggregated route, want 2", n)
	}
	if n := testutil.ToFloat64(dis.m.requests.WithLabelValues(d.dec[0].spec.URL, "ok", routeDisaggregated)); n != 2 {
		t.Errorf("the decode worker finished %v disaggregated requests, want 2", n)
	}

	prefills := decisions(dis, []*testWorker{d.pre})[0]
	req := sched.Request{Prompt: ids(20, 20), MaxTokens: 6, IgnoreEOS: true}
	got, want := generate(t, dis, req, nil), generate(t, agg, req, nil)
	if got.err != nil || !slices.Equal(got.tokens, want.tokens) {
		t.Fatalf("a short prompt: %v (%v); aggregated %v", got.tokens, got.err, want.tokens)
	}
	if n := routed(dis, routeLocal); n != 1 {
		t.Errorf("%v requests took the local route, want the short one", n)
	}
	if n := decisions(dis, []*testWorker{d.pre})[0]; n != prefills {
		t.Errorf("the short prompt was routed to the prefill worker too (%v decisions, %v before)", n, prefills)
	}
	if n := routed(agg, routeAggregated); n != 3 {
		t.Errorf("the aggregated router counted %v aggregated requests, want 3", n)
	}
	idle(t, dis)
}

// TestFailedPrefillMovesThenFallsBack: a prefill worker that refuses
// connections costs nothing — the prefill moves to the other prefill
// worker (one migration counted) — and once no prefill worker is left, the
// decode worker prefills the prompt itself (route local). The tokens are
// an aggregated worker's every time.
func TestFailedPrefillMovesThenFallsBack(t *testing.T) {
	d := startDisagg(t, 1)
	ns := namespace([]*testWorker{d.agg})
	dead := WorkerSpec{URL: "http://" + freeport.Addr(t), Role: RolePrefill} // nothing listens
	agg, _ := newRouter(t, Config{Workers: []WorkerSpec{d.agg.spec}, Namespace: ns, Cache: d.cache})
	dis, _ := newRouter(t, Config{Workers: []WorkerSpec{dead, d.pre.spec, d.dec[0].spec}, Namespace: ns, Cache: d.cache,
		DisaggMinUncached: 32, HealthInterval: time.Hour, Policy: policy.Config{TieBreak: policy.TieLowestIndex}})

	check := func(seed int, route string) {
		t.Helper()
		req := sched.Request{Prompt: ids(seed, 80), MaxTokens: 8, IgnoreEOS: true}
		before := routed(dis, route)
		got, want := generate(t, dis, req, nil), generate(t, agg, req, nil) // first: the aggregated run leaves the blocks in the cache
		if got.err != nil || !slices.Equal(got.tokens, want.tokens) {
			t.Fatalf("prompt %d: %v (%v); aggregated %v", seed, got.tokens, got.err, want.tokens)
		}
		if n := routed(dis, route) - before; n != 1 {
			t.Errorf("prompt %d did not take the %s route", seed, route)
		}
	}
	check(30, routeDisaggregated) // the dead worker first (the lowest index), then the live one
	if n := testutil.ToFloat64(dis.m.migrations.WithLabelValues(causeRefused)); n != 1 {
		t.Errorf("%v refused migrations counted, want the dead prefill worker's 1", n)
	}
	if dis.Healthy(dead.URL) {
		t.Error("the refusing prefill worker is still a candidate")
	}
	d.pre.stop(0)
	check(31, routeLocal) // no prefill worker left
	idle(t, dis)
}

// TestDecodeWorkerDyingMidStreamIsReplaced: in disaggregated serving, a
// decode worker stopped in the middle of a stream is replaced by the other
// decode worker — never by the prefill worker — and the client gets the
// very tokens of an undisturbed run.
func TestDecodeWorkerDyingMidStreamIsReplaced(t *testing.T) {
	d := startDisagg(t, 2)
	ns := namespace([]*testWorker{d.agg})
	r, _ := newRouter(t, Config{Workers: []WorkerSpec{d.pre.spec, d.dec[0].spec, d.dec[1].spec}, Namespace: ns, Cache: d.cache,
		DisaggMinUncached: -1}) // the second run finds the blocks in the cache: disaggregated all the same
	const maxTokens = 24
	req := sched.Request{Prompt: ids(40, 100), MaxTokens: maxTokens, IgnoreEOS: true}
	undisturbed := generate(t, r, req, nil)
	if undisturbed.err != nil || len(undisturbed.tokens) != maxTokens {
		t.Fatalf("undisturbed run: %d tokens, %v", len(undisturbed.tokens), undisturbed.err)
	}
	finished := func(i int) float64 {
		return testutil.ToFloat64(r.m.requests.WithLabelValues(d.dec[i].spec.URL, "ok", routeDisaggregated))
	}
	before := []float64{finished(0), finished(1)}
	killed := -1
	res := generate(t, r, req, func(toks []uint32) {
		if killed >= 0 || len(toks) < 5 {
			return
		}
		for i, w := range d.dec {
			if l := r.Load(w.spec.URL); l.Decoding > 0 {
				killed = i
				w.stop(0)
				return
			}
		}
	})
	if killed < 0 {
		t.Fatal("no decode worker was seen serving the request")
	}
	if res.err != nil || !slices.Equal(res.tokens, undisturbed.tokens) {
		t.Fatalf("after the kill: %v (%v); undisturbed %v", res.tokens, res.err, undisturbed.tokens)
	}
	if n := testutil.ToFloat64(r.m.migrations.WithLabelValues(causeBroken)); n != 1 {
		t.Errorf("%v broken-stream migrations counted, want 1", n)
	}
	if n := finished(1-killed) - before[1-killed]; n != 1 {
		t.Errorf("the other decode worker finished %v disaggregated requests, want the moved one", n)
	}
	idle(t, r)
}

func TestConfigValidateRoles(t *testing.T) {
	ns := namespace(startWorkers(t, 1, "sim", ""))
	w := func(port, role string) WorkerSpec { return WorkerSpec{URL: "http://127.0.0.1:" + port, Role: role} }
	for _, c := range []struct {
		workers []WorkerSpec
		want    string
	}{
		{[]WorkerSpec{w("1", RolePrefill)}, "1 prefill workers but no decode worker"},
		{[]WorkerSpec{w("1", RoleDecode), w("2", RoleDecode)}, "2 decode workers but no prefill worker"},
		{[]WorkerSpec{w("1", ""), w("2", RolePrefill), w("3", RoleDecode)}, "1 aggregated workers listed with prefill or decode ones"},
		{[]WorkerSpec{w("1", "encode")}, `has role "encode"`},
	} {
		cfg := Config{Workers: c.workers, Namespace: ns}
		cfg.EnsureDefaults()
		if err := cfg.Validate(); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want ErrBadConfig saying %q", c.workers, err, c.want)
		}
	}
	ok := Config{Workers: []WorkerSpec{w("1", RolePrefill), w("2", RoleDecode)}, Namespace: ns}
	ok.EnsureDefaults()
	if err := ok.Validate(); err != nil {
		t.Errorf("a prefill and a decode worker: %v", err)
	}
}

package frontend

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// TestPlannerCountersCountArrivalsAndCachedTokens: the counters the
// planner sizes workers by count each accepted request and its prompt
// tokens on arrival, the prompt tokens its worker found cached, and the
// prefix tokens each routing decision credits to the worker's pool.
func TestPlannerCountersCountArrivalsAndCachedTokens(t *testing.T) {
	ws := startWorkers(t, 1, "sim", "")
	r, _ := newRouter(t, Config{Workers: specs(ws), Namespace: namespace(ws), Policy: policy.Config{Policy: policy.KVHBM}})
	prefix := ids(1, 256)
	if res := generate(t, r, sched.Request{Prompt: prefix, MaxTokens: 4, IgnoreEOS: true}, nil); res.err != nil {
		t.Fatal(res.err)
	}
	hashes := namespace(ws).Hashes(prefix)
	waitFor(t, "the index learns the first request's blocks", func() bool {
		m := r.Index().Overlap(r.ns, hashes, nil)
		return len(m) == 1 && m[0].Blocks == len(hashes)
	})
	second := append(slices.Clone(prefix), ids(2, 40)...)
	if res := generate(t, r, sched.Request{Prompt: second, MaxTokens: 4, IgnoreEOS: true}, nil); res.err != nil {
		t.Fatal(res.err)
	}
	if n := testutil.ToFloat64(r.m.arrivals); n != 2 {
		t.Errorf("arrivals %v, want 2", n)
	}
	if n := testutil.ToFloat64(r.m.promptTokens); n != 256+296 {
		t.Errorf("prompt tokens %v, want %d", n, 256+296)
	}
	if n := testutil.ToFloat64(r.m.cachedTokens); n < 256 || n > 296 {
		t.Errorf("cached prompt tokens %v, want the second request's 256-token prefix", n)
	}
	if n := testutil.ToFloat64(r.m.prefixTokens.WithLabelValues("pool")); n != 256 {
		t.Errorf("routed prefix tokens in the pool %v, want 256", n)
	}
	if _, err := r.Generate(t.Context(), sched.Request{MaxTokens: 1}); err == nil || testutil.ToFloat64(r.m.arrivals) != 2 {
		t.Errorf("a bad request (%v) counted as an arrival", err)
	}
}

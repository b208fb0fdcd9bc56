package profiler

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

var limits = sim.WorkerLimits{KVTokens: 65536, BlockTokens: 16, MaxNumSeqs: 256, MaxNumBatchedTokens: 2048}

func msd(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sweepOf is what an exact profiler would measure of a worker with
// profile p and limits lim.
func sweepOf(t *testing.T, p sim.Profile, isls, concs, ctxs []int) sim.Sweep {
	t.Helper()
	m, err := perf.New(p, limits)
	if err != nil {
		t.Fatal(err)
	}
	var sw sim.Sweep
	for _, isl := range isls {
		sw.Prefill = append(sw.Prefill, sim.PrefillPoint{ISL: isl, TTFTMs: msd(m.PrefillTime(float64(isl)))})
	}
	for _, ctx := range ctxs {
		for _, c := range concs {
			if c*ctx > limits.KVTokens {
				continue // the profiler skips what does not fit the pool
			}
			sw.Decode = append(sw.Decode, sim.DecodePoint{Concurrency: c, Context: ctx, ITLMs: msd(m.DecodeStep(c, float64(ctx)))})
		}
	}
	return sw
}

// TestFitRecoversDynamosProfile: fitted to exact measurements of the
// default profile, the curves give back its times at the swept points
// and its decode polynomial's coefficients, and the long prompts check
// within 10 %.
func TestFitRecoversDynamosProfile(t *testing.T) {
	truth := sim.DefaultProfile()
	sw := sweepOf(t, truth, []int{128, 512, 2048, 5000, 8192, 32768}, []int{1, 2, 4, 8, 16}, []int{1024, 4096})
	p, checks, err := Fit(sw, limits, "test")
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != 2 || p.Worker == nil || *p.Worker != limits || p.Sweep == nil {
		t.Fatalf("fitted profile: version %d, worker %v, sweep %v; want version 2 carrying both", p.Version, p.Worker, p.Sweep)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := len(p.Prefill.Points); got != 3 {
		t.Errorf("prefill table has %d points, want the 3 ISLs ≤ 2048", got)
	}
	want := []float64{5.74, 54.01, -25.74}
	for i, c := range p.Decode.Poly {
		if math.Abs(c-want[i]) > 1e-4 { // times are whole nanoseconds
			t.Errorf("decode poly %v, want %v", p.Decode.Poly, want)
			break
		}
	}
	if math.Abs(p.Decode.PerSeqMs) > 1e-6 {
		t.Errorf("decode per_seq_ms %v, want 0", p.Decode.PerSeqMs)
	}
	if len(checks) != 3 {
		t.Fatalf("%d checks, want one per ISL > 2048 (5000, 8192, 32768)", len(checks))
	}
	for _, c := range checks {
		if math.Abs(c.Err()) > 0.10 {
			t.Errorf("ISL %d: predicted %.2f ms, measured %.2f ms: %+.1f %%, more than 10 %%", c.ISL, c.PredictedMs, c.MeasuredMs, 100*c.Err())
		}
	}
}

// TestFitFindsTheCostPerSequence: with two contexts p and the batch tell
// apart, so a per-sequence cost is recovered.
func TestFitFindsTheCostPerSequence(t *testing.T) {
	truth := sim.DefaultProfile()
	truth.Decode.PerSeqMs = 0.05
	sw := sweepOf(t, truth, []int{128, 2048}, []int{1, 4, 16, 64}, []int{1024, 4096})
	p, _, err := Fit(sw, limits, "test")
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(p.Decode.PerSeqMs-0.05) > 1e-5 {
		t.Errorf("per_seq_ms %v, want 0.05", p.Decode.PerSeqMs)
	}
}

// TestFitWithOneContextLeavesTheBatchTermOut: with one context p is
// proportional to the batch, so the normal equations are singular; the
// fit drops the batch term and still reproduces every swept point.
func TestFitWithOneContextLeavesTheBatchTermOut(t *testing.T) {
	truth := sim.DefaultProfile()
	sw := sweepOf(t, truth, []int{128, 2048}, []int{1, 2, 4, 8, 16}, []int{4096})
	p, _, err := Fit(sw, limits, "test")
	if err != nil {
		t.Fatal(err)
	}
	if p.Decode.PerSeqMs != 0 {
		t.Errorf("per_seq_ms %v, want the term left out", p.Decode.PerSeqMs)
	}
	m, _ := perf.FromProfile(p)
	for _, pt := range sw.Decode {
		if got := msd(m.DecodeStep(pt.Concurrency, float64(pt.Context))); math.Abs(got-pt.ITLMs) > 1e-3 {
			t.Errorf("c=%d: fitted %.4f ms, measured %.4f ms", pt.Concurrency, got, pt.ITLMs)
		}
	}
}

func TestFitRefusesTooLittleData(t *testing.T) {
	truth := sim.DefaultProfile()
	for _, tc := range []struct {
		name string
		sw   sim.Sweep
		lim  sim.WorkerLimits
		want string
	}{
		{"one short ISL", sweepOf(t, truth, []int{128, 8192}, []int{1}, []int{1024}), limits, "1 prefill input lengths ≤ max_num_batched_tokens (2048) measured, need at least 2"},
		{"no decode", sweepOf(t, truth, []int{128, 512}, nil, nil), limits, "no decode points"},
		{"no KV size", sweepOf(t, truth, []int{128, 512}, []int{1}, []int{1024}), sim.WorkerLimits{MaxNumBatchedTokens: 2048}, "KV tokens (0)"},
	} {
		_, _, err := Fit(tc.sw, tc.lim, "test")
		if !errors.Is(err, ErrFit) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrFit saying %q", tc.name, err, tc.want)
		}
	}
}

// TestFitAveragesARepeatedLength: a length measured three times is one
// table point at the three's mean.
func TestFitAveragesARepeatedLength(t *testing.T) {
	sw := sweepOf(t, sim.DefaultProfile(), []int{128}, []int{1, 2, 4}, []int{1024, 4096})
	sw.Prefill = append(sw.Prefill, sim.PrefillPoint{ISL: 2048, TTFTMs: 40}, sim.PrefillPoint{ISL: 2048, TTFTMs: 50}, sim.PrefillPoint{ISL: 2048, TTFTMs: 90})
	p, _, err := Fit(sw, limits, "test")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Prefill.Points; len(got) != 2 || got[1] != [2]float64{2048, 60} {
		t.Errorf("prefill points %v, want 128 and 2048 at the mean 60 ms", got)
	}
	if len(p.Sweep.Prefill) != 4 {
		t.Errorf("the sweep keeps %d points, want all 4 measurements", len(p.Sweep.Prefill))
	}
}

func TestLeastSquaresSolvesAnExactSystem(t *testing.T) {
	// y = 2 + 3x − x² + 0.5·b over points that determine it.
	var rows [][4]float64
	var ys []float64
	for _, pt := range [][2]float64{{0, 1}, {0.5, 2}, {1, 3}, {0.25, 8}, {0.75, 4}} {
		x, b := pt[0], pt[1]
		rows = append(rows, [4]float64{1, x, x * x, b})
		ys = append(ys, 2+3*x-x*x+0.5*b)
	}
	got, ok := leastSquares(rows, ys, []int{0, 1, 2, 3})
	if !ok {
		t.Fatal("singular")
	}
	for i, w := range []float64{2, 3, -1, 0.5} {
		if math.Abs(got[i]-w) > 1e-9 {
			t.Fatalf("β = %v, want [2 3 -1 0.5]", got)
		}
	}
	if _, ok := leastSquares(rows[:1], ys[:1], []int{0, 1}); ok {
		t.Error("one point fitted a line: want singular")
	}
}

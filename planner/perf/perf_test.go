package perf

import (
	"math"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

func dynamo(t *testing.T) Model {
	t.Helper()
	m, err := New(sim.DefaultProfile(), sim.WorkerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func TestPrefillTimeChunksLongPrompts(t *testing.T) {
	m := dynamo(t)
	chunk := 16.50142 + 1.518344e-2*2048 + 4.209989e-7*2048*2048
	rest := 16.50142 + 1.518344e-2*100 + 4.209989e-7*100*100
	if got, want := ms(m.PrefillTime(2*2048+100)), 2*chunk+rest; math.Abs(got-want) > 0.01 {
		t.Errorf("PrefillTime(4196) = %.3f ms, want two full chunks and one of 100 tokens, %.3f ms", got, want)
	}
	if m.PrefillTime(0) != 0 {
		t.Errorf("PrefillTime(0) = %v, want 0: nothing to prefill", m.PrefillTime(0))
	}
}

func TestPrefillCapacityFollowsMD1(t *testing.T) {
	m := dynamo(t)
	s := m.PrefillTime(2048).Seconds()
	// ρ* = 2(τ − S)/(2τ − S); with τ = 2S that is 2/3.
	got, ok := m.PrefillCapacity(2048, time.Duration(2*s*float64(time.Second)), 1)
	if want := (2.0 / 3) * 2048 / s; !ok || math.Abs(got-want)/want > 1e-6 {
		t.Errorf("PrefillCapacity at τ = 2S = %.1f tok/s, %v; want %.1f, true", got, ok, want)
	}
	// A target looser than it takes alone is capped at MaxUtilisation.
	got, _ = m.PrefillCapacity(2048, time.Hour, 1)
	if want := m.MaxUtilisation * 2048 / s; math.Abs(got-want)/want > 1e-6 {
		t.Errorf("PrefillCapacity with a loose target = %.1f, want the cap %.1f", got, want)
	}
	// A prompt that alone takes longer than the target: no worker count helps.
	if _, ok := m.PrefillCapacity(2048, time.Duration(s*float64(time.Second)/2), 1); ok {
		t.Error("PrefillCapacity with τ < S is feasible, want not")
	}
	// A correction of 2 halves the capacity at a loose target.
	a, _ := m.PrefillCapacity(2048, time.Hour, 1)
	b, _ := m.PrefillCapacity(2048, time.Hour, 2)
	if math.Abs(a/b-2) > 1e-6 {
		t.Errorf("capacity ratio for correction 2 is %.3f, want 2", a/b)
	}
}

func TestDecodeCapacityRespectsTargetAndPool(t *testing.T) {
	m := dynamo(t)
	tp, c, ok := m.DecodeCapacity(4096, 30*time.Millisecond, 1)
	if !ok || c < 1 || c > m.KVTokens/4096 {
		t.Fatalf("DecodeCapacity = %.1f, %d, %v; want a concurrency within the pool's %d sequences", tp, c, ok, m.KVTokens/4096)
	}
	if step := m.DecodeStep(c, 4096); step > 30*time.Millisecond {
		t.Errorf("chosen concurrency %d steps in %v, over the 30 ms target", c, step)
	}
	if _, _, ok := m.DecodeCapacity(4096, time.Millisecond/2, 1); ok {
		t.Error("a target below the shortest step is feasible, want not")
	}
	if _, _, ok := m.DecodeCapacity(float64(m.KVTokens)+1, time.Second, 1); ok {
		t.Error("a context longer than the pool is feasible, want not")
	}
}

func TestNeedScalesWithRateAndCache(t *testing.T) {
	m := dynamo(t)
	tg := Targets{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond}
	one := m.Need(Load{Rate: 1, ISL: 8192, OSL: 256}, tg, Corrections{})
	two := m.Need(Load{Rate: 2, ISL: 8192, OSL: 256}, tg, Corrections{})
	if !one.PrefillOK || !one.DecodeOK {
		t.Fatalf("Need = %+v, want both feasible", one)
	}
	if math.Abs(two.Aggregated/one.Aggregated-2) > 1e-9 {
		t.Errorf("twice the rate needs %.3f× the workers, want 2×", two.Aggregated/one.Aggregated)
	}
	half := m.Need(Load{Rate: 1, ISL: 8192, OSL: 256, Hit: 0.5}, tg, Corrections{})
	if half.Prefill >= one.Prefill {
		t.Errorf("half the prompt cached needs %.3f prefill workers, want fewer than %.3f", half.Prefill, one.Prefill)
	}
	if all := m.Need(Load{Rate: 1, ISL: 8192, OSL: 256, Hit: 1}, tg, Corrections{}); all.Prefill != 0 || !all.PrefillOK {
		t.Errorf("a fully cached prompt needs %+v prefill, want 0 and feasible", all)
	}
}

func TestNewRejectsBadLimits(t *testing.T) {
	if _, err := New(sim.DefaultProfile(), sim.WorkerLimits{MaxNumSeqs: 64, MaxNumBatchedTokens: 32}); err == nil {
		t.Error("New accepted max batched tokens below max seqs")
	}
}

func TestPrefillCapacityForAQuantileLeavesHeadroom(t *testing.T) {
	m := dynamo(t)
	s := m.PrefillTime(10000)
	tau := 7 * s
	mean, _ := m.PrefillCapacity(10000, tau, 1)
	p99, ok := m.PrefillCapacityQ(10000, tau, 0.99, 1)
	if !ok || !(p99 < mean) {
		t.Fatalf("p99 capacity %.0f tok/s (%v), want feasible and below the mean's %.0f", p99, ok, mean)
	}
	// At the capacity's utilisation the M/D/1 tail at τ − S is 1 %.
	rho := p99 * s.Seconds() / 10000
	x := tailRate(rho)
	if math.Abs(rho*math.Expm1(x)-x) > 1e-9 {
		t.Errorf("tailRate(%.3f) = %v does not solve ρ(e^x − 1) = x", rho, x)
	}
	if tail := rho * math.Exp(-x*6); math.Abs(tail-0.01) > 1e-4 {
		t.Errorf("tail at ρ %.3f is %.4f, want 0.01", rho, tail)
	}
	// A looser quantile allows more; q = 0 is the mean target.
	if p90, _ := m.PrefillCapacityQ(10000, tau, 0.9, 1); !(p90 > p99) {
		t.Errorf("p90 capacity %.0f is not above p99's %.0f", p90, p99)
	}
	if q0, _ := m.PrefillCapacityQ(10000, tau, 0, 1); q0 != mean {
		t.Errorf("q = 0 gives %.0f, want the mean target's %.0f", q0, mean)
	}
	if _, ok := m.PrefillCapacityQ(10000, s/2, 0.99, 1); ok {
		t.Error("a target below the prompt's own time is feasible, want not")
	}
}

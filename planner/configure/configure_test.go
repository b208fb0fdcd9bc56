package configure

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

func input() Input {
	return Input{Profile: sim.DefaultProfile(), Budget: 8, ISL: 4096, OSL: 256,
		Targets: perf.Targets{TTFT: 500 * time.Millisecond, ITL: 30 * time.Millisecond}}
}

func evaluateOK(t *testing.T, in Input) Result {
	t.Helper()
	r, err := Evaluate(in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTheParetoFrontIsNonDominated(t *testing.T) {
	r := evaluateOK(t, input())
	if want := 8 * len(input().pairs()); len(r.Points) != want {
		t.Fatalf("%d candidates, want %d (aggregated and 7 splits for each pair of limits)", len(r.Points), want)
	}
	if len(r.Front) < 2 {
		t.Fatalf("front %v: want a trade-off of at least two points", r.Front)
	}
	for i, p := range r.Front {
		if !p.Feasible() {
			t.Errorf("front point %v serves nothing", p)
		}
		if i > 0 && (p.TokensPerUser < r.Front[i-1].TokensPerUser || p.ThroughputPerWorker >= r.Front[i-1].ThroughputPerWorker) {
			t.Errorf("front out of order or dominated: %v then %v", r.Front[i-1], p)
		}
		for _, q := range r.Points {
			if q.Feasible() && q.ThroughputPerWorker >= p.ThroughputPerWorker && q.TokensPerUser >= p.TokensPerUser &&
				(q.ThroughputPerWorker > p.ThroughputPerWorker || q.TokensPerUser > p.TokensPerUser) {
				t.Errorf("front point %v is dominated by %v", p, q)
			}
		}
	}
	// Every feasible point is on the front or below some point of it.
	for _, q := range r.Points {
		covered := !q.Feasible()
		for _, p := range r.Front {
			covered = covered || (p.ThroughputPerWorker >= q.ThroughputPerWorker && p.TokensPerUser >= q.TokensPerUser)
		}
		if !covered {
			t.Errorf("%v is neither on the front nor below it", q)
		}
	}
	if r.Best == nil || r.Best.ThroughputPerWorker != r.Front[0].ThroughputPerWorker {
		t.Errorf("best %v is not the front's highest throughput %v", r.Best, r.Front[0])
	}
}

func TestTheBestConfigurationMeetsItsTargetsPerPerf(t *testing.T) {
	in := input()
	r := evaluateOK(t, in)
	for _, best := range []*Point{r.Best, r.BestAggregated} {
		if best == nil || !best.Feasible() {
			t.Fatalf("no best configuration: %+v", r)
		}
		m, err := perf.New(in.Profile, sim.WorkerLimits{MaxNumSeqs: best.MaxNumSeqs, MaxNumBatchedTokens: best.MaxNumBatchedTokens})
		if err != nil {
			t.Fatal(err)
		}
		n := m.Need(perf.Load{Rate: best.Rate, ISL: in.ISL, OSL: in.OSL}, in.Targets, perf.Corrections{})
		fits := n.Aggregated <= float64(in.Budget)
		if best.Mode == Disaggregated {
			fits = n.Prefill <= float64(best.Prefill) && n.Decode <= float64(best.Decode)
		}
		if !fits || !n.PrefillOK || !n.DecodeOK {
			t.Errorf("%v at %v req/s needs %+v: more than it has", best, best.Rate, n)
		}
		// λ_max is the most it serves: 1 % more does not fit.
		more := m.Need(perf.Load{Rate: 1.01 * best.Rate, ISL: in.ISL, OSL: in.OSL}, in.Targets, perf.Corrections{})
		if best.Mode == Aggregated && more.Aggregated <= float64(in.Budget) {
			t.Errorf("%v: 1 %% above λ_max still fits (%v)", best, more.Aggregated)
		}
		if step := m.DecodeStep(best.Concurrency, in.ISL+in.OSL/2); step > in.Targets.ITL || math.Abs(best.ITLMs-float64(step)/1e6) > 1e-9 {
			t.Errorf("%v: ITL %v at concurrency %d (reported %v ms), target %v", best, step, best.Concurrency, best.ITLMs, in.Targets.ITL)
		}
		if best.TTFTMs <= 0 || best.TTFTMs > float64(in.Targets.TTFT.Milliseconds())*(1+1e-9) {
			t.Errorf("%v: expected TTFT %v ms, target %v", best, best.TTFTMs, in.Targets.TTFT)
		}
		if want := best.Rate * in.OSL / float64(in.Budget); math.Abs(best.ThroughputPerWorker-want) > 1e-9*want {
			t.Errorf("throughput per worker %v, want λ_max·OSL/G = %v", best.ThroughputPerWorker, want)
		}
	}
	if r.BestAggregated.Mode != Aggregated {
		t.Errorf("best aggregated is %v", r.BestAggregated)
	}
}

func TestTheRejectedConfigurationRanksBelow(t *testing.T) {
	r := evaluateOK(t, input())
	rej, best := r.Rejected, r.BestAggregated
	if rej == nil || best == nil {
		t.Fatalf("rejected %v, best aggregated %v", rej, best)
	}
	if rej.Mode != Aggregated || (rej.MaxNumSeqs == best.MaxNumSeqs && rej.MaxNumBatchedTokens == best.MaxNumBatchedTokens) {
		t.Errorf("rejected %v is not an aggregated deployment with other limits than %v", rej, best)
	}
	if rej.Rate >= best.Rate || rej.ThroughputPerWorker >= best.ThroughputPerWorker {
		t.Errorf("rejected %v serves %v req/s, the best %v", rej, rej.Rate, best.Rate)
	}
}

func TestADisaggregatedSplitIsSizedPerPool(t *testing.T) {
	in := input()
	in.Budget = 2
	r := evaluateOK(t, in)
	for _, p := range r.Points {
		if p.Mode != Disaggregated {
			continue
		}
		if p.Prefill != 1 || p.Decode != 1 || p.Workers != 2 {
			t.Fatalf("split %v of a budget of 2", p)
		}
		m, _ := perf.New(in.Profile, sim.WorkerLimits{MaxNumSeqs: p.MaxNumSeqs, MaxNumBatchedTokens: p.MaxNumBatchedTokens})
		n := m.Need(perf.Load{Rate: p.Rate, ISL: in.ISL, OSL: in.OSL}, in.Targets, perf.Corrections{})
		// One of the two pools is what limits it.
		if p.Feasible() && math.Max(n.Prefill, n.Decode) < 1-1e-6 {
			t.Errorf("%v at λ_max %v needs only %+v of 1:1", p, p.Rate, n)
		}
	}
}

func TestUnreachableTargetsLeaveNoBest(t *testing.T) {
	in := input()
	in.Targets.TTFT = time.Millisecond // a 4096-token prompt alone takes longer
	r := evaluateOK(t, in)
	if r.Best != nil || r.BestAggregated != nil || len(r.Front) != 0 {
		t.Errorf("best %v, front %v: want none", r.Best, r.Front)
	}
	for _, p := range r.Points {
		if p.Reason != "ttft-infeasible" || p.Rate != 0 {
			t.Fatalf("%v: reason %q rate %v", p, p.Reason, p.Rate)
		}
	}
	in = input()
	in.Targets.ITL = 100 * time.Microsecond
	r = evaluateOK(t, in)
	if r.Best != nil || r.Points[0].Reason != "itl-infeasible" {
		t.Errorf("an ITL below any step: best %v, reason %q", r.Best, r.Points[0].Reason)
	}
}

func TestABadInputIsRejectedWithEveryProblem(t *testing.T) {
	in := Input{Profile: sim.Profile{}, Budget: 0, ISL: 0, OSL: math.NaN(), Hit: 1, KVTokens: -1,
		MaxNumSeqs: []int{0}, MaxNumBatchedTokens: []int{-5}}
	_, err := Evaluate(in)
	if !errors.Is(err, ErrBadInput) {
		t.Fatalf("Evaluate = %v, want ErrBadInput", err)
	}
	for _, want := range []string{"prefill", "budget 0", "ISL 0", "OSL NaN", "hit 1", "TTFT target 0s", "ITL target 0s", "KV tokens -1", "max_num_seqs 0", "max_num_batched_tokens -5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	in = input()
	in.MaxNumSeqs, in.MaxNumBatchedTokens = []int{512}, []int{256}
	if _, err := Evaluate(in); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "no batch limits to try") {
		t.Errorf("limits that pair to nothing: %v", err)
	}
}

func TestTheProfilesWorkerGivesTheKVPool(t *testing.T) {
	in := input()
	in.ISL, in.OSL, in.Targets.ITL = 1000, 100, 100*time.Millisecond
	p := sim.DefaultProfile()
	p.Version, p.Worker = 2, &sim.WorkerLimits{KVTokens: 4096}
	in.Profile = p
	r := evaluateOK(t, in)
	// Sequences of 1050 tokens of context: three fit in 4096 tokens.
	if r.Input.KVTokens != 4096 || r.Best == nil || r.Best.Concurrency != 3 {
		t.Errorf("KV %d, best %+v (concurrency %d): want the profile's 4096 tokens, 3 sequences a worker", r.Input.KVTokens, r.Best, r.Best.Concurrency)
	}
	in.KVTokens = 8192 // the caller's pool wins
	if r := evaluateOK(t, in); r.Input.KVTokens != 8192 {
		t.Errorf("KV %d, want the caller's 8192", r.Input.KVTokens)
	}
}

package configure

import (
	"context"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/replay/simulate"
	"github.com/kvstrata/kvstrata/router/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// replayITLAllowance is how far above the ITL target the recommended
// configuration's measured mean ITL may be: a known gap of perf, not
// noise (the replay is deterministic). An aggregated worker runs chunked
// prefill: a step that carries a prompt's chunk takes the chunk's prefill
// time, and every stream in it waits that long for its token, which
// perf's Need (prefill share + decode share of a worker's time, the
// decode step at the ITL target) does not count. This replay measures
// +8 % (16.2 ms against 15 ms); until perf counts it, the allowance covers
// it, and the test still fails if the gap grows.
const replayITLAllowance = 0.15

// TestTheRecommendedConfigurationBeatsARejectedOneInTheReplay checks the
// configurator against the simulated replay, which runs the real
// scheduler (chunked prefill, continuous batching, preemption) over the
// same profile: the best aggregated configuration for a budget of 2
// workers and one it rejected with other batch limits both replay the
// same trace at the recommended λ_max. The recommended one meets the
// targets (mean TTFT within the target, mean ITL within the target plus
// replayITLAllowance) and serves at least the rejected one's output
// tokens a second per worker, or the rejected one misses the targets.
// The best configuration overall may be disaggregated; the replay runs
// aggregated workers only, hence BestAggregated.
func TestTheRecommendedConfigurationBeatsARejectedOneInTheReplay(t *testing.T) {
	const (
		workers  = 2
		isl, osl = 1024, 128
		kvTokens = 65536
		requests = 300
	)
	targets := perf.Targets{TTFT: 250 * time.Millisecond, ITL: 15 * time.Millisecond}
	r := evaluateOK(t, Input{Profile: sim.DefaultProfile(), KVTokens: kvTokens, Budget: workers, ISL: isl, OSL: osl, Targets: targets})
	best, rej := r.BestAggregated, r.Rejected
	if best == nil || rej == nil {
		t.Fatalf("best aggregated %v, rejected %v: want both", best, rej)
	}
	if rej.MaxNumSeqs == best.MaxNumSeqs && rej.MaxNumBatchedTokens == best.MaxNumBatchedTokens {
		t.Fatalf("rejected %v has the best's limits", rej)
	}
	t.Logf("recommended %v: λ_max %.2f req/s, %.1f tok/s/worker, perf's TTFT %.1f ms, ITL %.1f ms", best, best.Rate, best.ThroughputPerWorker, best.TTFTMs, best.ITLMs)
	t.Logf("rejected %v: λ_max %.2f req/s %s", rej, rej.Rate, rej.Reason)

	// Prompts of isl tokens that share nothing (no prefix hits, as Hit 0
	// says), arriving at a constant best.Rate a second.
	reqs := make([]trace.Request, requests)
	for i := range reqs {
		ids := make([]uint64, isl/16)
		for j := range ids {
			ids[j] = uint64(i)<<20 | uint64(j)
		}
		reqs[i] = trace.Request{Timestamp: int64(i), InputLength: isl, OutputLength: osl, HashIDs: ids}
	}
	constant, err := trace.ParseCurve("steps:1@0")
	if err != nil {
		t.Fatal(err)
	}
	reqs, err = trace.Rescale(reqs, constant, time.Duration(requests/best.Rate*float64(time.Second)))
	if err != nil {
		t.Fatal(err)
	}

	replayAt := func(p *Point) simulate.Row {
		t.Helper()
		rows, err := simulate.Run(context.Background(), reqs, simulate.Config{
			Workers: workers, Policies: []policy.Policy{policy.LeastLoaded}, PoolTokens: kvTokens,
			MaxNumSeqs: p.MaxNumSeqs, MaxNumBatchedTokens: p.MaxNumBatchedTokens,
			DRAMTokens: 1 << 16, SSDTokens: 1 << 18,
		})
		if err != nil {
			t.Fatal(err)
		}
		row := rows[0]
		if row.Completed != requests {
			t.Fatalf("%v: %d of %d requests completed (%s)", p, row.Completed, requests, row.FirstError)
		}
		t.Logf("replay of %v: mean TTFT %.1f ms, mean ITL %.1f ms, %.1f tok/s/worker", p, 1e3*row.TTFTMeanS, 1e3*row.ITLMeanS, row.OutputTokensPerS/workers)
		return row
	}
	meets := func(row simulate.Row) bool {
		return row.TTFTMeanS <= targets.TTFT.Seconds() && row.ITLMeanS <= targets.ITL.Seconds()*(1+replayITLAllowance)
	}
	good, bad := replayAt(best), replayAt(rej)
	if !meets(good) {
		t.Errorf("the recommended %v misses its targets at its λ_max %.2f req/s: mean TTFT %.1f ms (target %v), mean ITL %.1f ms (target %v + %.0f %%)",
			best, best.Rate, 1e3*good.TTFTMeanS, targets.TTFT, 1e3*good.ITLMeanS, targets.ITL, 100*replayITLAllowance)
	}
	if good.OutputTokensPerS < bad.OutputTokensPerS && meets(bad) {
		t.Errorf("the rejected %v meets the targets and serves %.1f tok/s/worker, more than the recommended %v's %.1f",
			rej, bad.OutputTokensPerS/workers, best, good.OutputTokensPerS/workers)
	}
}

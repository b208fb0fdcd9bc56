package sched_test

import (
	"testing"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/sched"
)

// BenchmarkSharedPrefixes runs 64 requests arriving at once, 16 groups of
// 4 sharing a 512-token prefix, each with 32 tokens of its own and 16
// generated, new suffixes each iteration, on a fresh engine (an empty pool: a worker that just started,
// or whose pool has moved on), once without a cache and once with a real
// cache node that an earlier engine filled with the groups' prefixes. The sim model sleeps its
// modelled step times in real time (Dynamo mocker's profile, speedup 1), so
// that computing a token costs what it would on a GPU worker; its KV is
// 1 KiB a token (4 layers of 256 bytes), 16 KiB a block, so onboarding
// moves 32 MiB through the node per iteration. Reported per iteration: the
// wall time (ns/op), the prompt tokens computed, onboarded from kvstrata,
// and found in the engine's own pool.
//
//	go test -run '^$' -bench SharedPrefixes -benchtime 3x ./engine/sched/
func BenchmarkSharedPrefixes(b *testing.B) {
	w := sharedPrefixLoad{groups: 16, perGroup: 4, prefix: 512, suffix: 32, gen: 16}
	const blocks = 2304 // 36,864 tokens: the whole load fits, no request waits for blocks
	newModel := func() *sim.Model {
		m, err := sim.New(sim.Config{TokenBytes: 256, Capacity: blocks * 16})
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	for _, cached := range []bool{false, true} {
		name := map[bool]string{false: "recompute", true: "onboard"}[cached]
		b.Run(name, func(b *testing.B) {
			cfg := sched.Config{Model: newModel(), Blocks: blocks}
			if cached {
				n := nodetest.Start(b, nodetest.Options{DRAMBytes: 128 << 20})
				cl := dial(b, n.Addr)
				cfg.Connector = newConn(b, n.Addr, nil)
				// The earlier engine served one request of each group, with
				// a suffix of its own: the cache holds the prefixes only.
				var first []sched.Request
				for g := range w.groups {
					p := append(tokens(w.prefix, uint32(1000+g)), tokens(w.suffix, uint32(5000+g))...)
					first = append(first, sched.Request{Prompt: p, MaxTokens: 1})
				}
				warm := newEngine(b, cfg)
				runAll(b, warm, first)
				for _, r := range first {
					waitHeld(b, cl, cfg.Model.Layout(), r.Prompt)
				}
				warm.Close()
			}
			var computed, onboarded, pooled int
			for b.Loop() {
				b.StopTimer()
				e := newEngine(b, cfg)
				b.StartTimer()
				w.round++ // suffixes the cache has not seen
				reqs := w.requests()
				res := runAll(b, e, reqs)
				b.StopTimer()
				for _, r := range res {
					if r.last.Err != nil || len(r.toks) != w.gen {
						b.Fatalf("a request ended with %d tokens: %v", len(r.toks), r.last.Err)
					}
					u := r.last.Usage
					computed += u.PromptTokens - u.CachedTokens
					onboarded += u.OnboardedTokens
					pooled += u.CachedTokens - u.OnboardedTokens
				}
				e.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(computed)/float64(b.N), "computed-tokens/op")
			b.ReportMetric(float64(onboarded)/float64(b.N), "onboarded-tokens/op")
			b.ReportMetric(float64(pooled)/float64(b.N), "pool-hit-tokens/op")
		})
	}
}

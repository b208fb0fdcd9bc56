package policy

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkChoose: one decision among 64 workers, each holding a different
// share of the prompt in its pool and the cache the rest in its tiers,
// with 64 sequences active (each decision's sequence ends before the next,
// over a steady background of others).
func BenchmarkChoose(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tokens int
		policy Policy
		temp   float64
	}{
		{"kv-tiered/4k-tokens", 4096, KVTiered, 0},
		{"kv-tiered/32k-tokens", 32768, KVTiered, 0},
		{"kv-tiered/4k-tokens/temperature", 4096, KVTiered, 0.5},
		{"kv-hbm/4k-tokens", 4096, KVHBM, 0},
		{"least-loaded/4k-tokens", 4096, LeastLoaded, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRouter(b, Config{Temperature: bc.temp, BusyPrefillTokens: -1, BusyBlockFraction: -1})
			rng := rand.New(rand.NewPCG(1, 2))
			req := Request{Tokens: bc.tokens, Blocks: bc.tokens / 16, Override: &Override{Policy: &bc.policy}}
			cands := make([]Candidate, 64)
			for i := range cands {
				c := &cands[i]
				c.Worker = fmt.Sprintf("worker-%02d", i)
				c.Capacity = 65536
				c.Overlap = rng.IntN(req.Blocks / 2)
				left := req.Blocks - c.Overlap
				for k := range c.Tiers {
					c.Tiers[k] = rng.IntN(left/4 + 1)
					left -= c.Tiers[k]
				}
			}
			for range 64 { // background load
				if _, err := r.Choose(req, cands); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				d, err := r.Choose(req, cands)
				if err != nil {
					b.Fatal(err)
				}
				d.Seq.Done()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			// On a shared machine the wall clock counts other processes' time.
			b.ReportMetric(float64(b.N)/(cpuTime()-cpu0).Seconds(), "decisions/cpu-s")
		})
	}
}

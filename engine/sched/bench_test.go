package sched

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// BenchmarkLoopOverhead measures the engine loop's own cost per generated
// token — scheduling, pool, arena copies, delivering Outputs to 64 readers —
// at 64 concurrent sequences. The sim model runs on a virtual clock, so its
// steps cost no wall time and the wall time is the loop's; the virtual
// time is the modelled step time at speedup 1. Reported:
//
//	ns/token        wall time per generated token
//	model-ns/token  modelled step time per generated token
//	overhead        the first over the second: the worker's overhead as a
//	                fraction of the modelled step time
func BenchmarkLoopOverhead(b *testing.B) {
	const seqs, promptLen, genLen = 64, 128, 64
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := sim.NewVirtualClock(start)
	m, err := sim.New(sim.Config{Sleep: clk.Sleep})
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(Config{Model: m, MaxNumSeqs: seqs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		var wg sync.WaitGroup
		for j := range seqs {
			ch, err := e.Generate(context.Background(), Request{Prompt: prompt(promptLen, uint32(i*seqs+j)), MaxTokens: genLen, IgnoreEOS: true})
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				for range ch {
				}
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	tokens := float64(b.N * seqs * genLen)
	wall, modelled := float64(b.Elapsed().Nanoseconds()), float64(clk.Now().Sub(start).Nanoseconds())
	b.ReportMetric(wall/tokens, "ns/token")
	b.ReportMetric(modelled/tokens, "model-ns/token")
	b.ReportMetric(wall/modelled, "overhead")
}

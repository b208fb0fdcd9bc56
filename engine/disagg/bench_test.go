package disagg_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/sched"
)

// BenchmarkHandoff measures disaggregated serving's handoff with tiny at
// its default shape (as bench/tiny-breakeven.sh), by prompt length,
// against recomputing the prompt on the decode worker:
//
//   - handoff: from the prefill worker's first token (its prefill done) to
//     the decode worker's first token: the prefill worker stores the
//     prompt's full blocks at the cache node, answers the params, and the
//     decode worker loads them and computes the remainder (the block of the
//     last token) — everything over real sockets to a node in the process.
//     store-ms and decode-ms split it; kv-MiB is the KV one handoff moves
//     (stored once, loaded once).
//   - recompute: the decode worker computing the whole prompt itself,
//     request to first token.
//
// Each iteration's prompt is new to both workers' pools and to the cache.
//
//	go test -run '^$' -bench Handoff -benchtime 5x ./engine/disagg/
func BenchmarkHandoff(b *testing.B) {
	mcfg := tiny.Config{ContextLen: 8192}
	for _, n := range []int{128, 512, 1024, 2048, 4096} {
		b.Run(fmt.Sprintf("tokens=%d/handoff", n), func(b *testing.B) {
			cache := startCache(b, "dram-capacity", "1GiB")
			prefill, decode := newWorkerOf(b, mcfg, cache), newWorkerOf(b, mcfg, cache)
			var store, dec time.Duration
			var moved int
			for i := 0; b.Loop(); i++ {
				p := prompt(n, uint32(1000*n+i))
				b.StopTimer()
				ch, err := prefill.Generate(context.Background(), sched.Request{Prompt: p, MaxTokens: 1,
					Transfer: &sched.KVTransferParams{DoRemoteDecode: true}})
				if err != nil {
					b.Fatal(err)
				}
				o := <-ch // the prefill's token: its blocks are being stored
				b.StartTimer()
				start := time.Now()
				for o = range ch {
				}
				stored := time.Now()
				if o.Err != nil || o.Transfer == nil {
					b.Fatalf("prefill: %+v", o)
				}
				first := firstToken(b, decode, sched.Request{Prompt: p, MaxTokens: 1, Transfer: o.Transfer})
				if first.Usage.OnboardedTokens != (n-1)/16*16 {
					b.Fatalf("decode side onboarded %d tokens of %d", first.Usage.OnboardedTokens, n)
				}
				store += stored.Sub(start)
				dec += time.Since(stored)
				moved = len(o.Transfer.BlockHashes) * prefill.blockBytes()
			}
			b.ReportMetric(float64(store)/1e6/float64(b.N), "store-ms/op")
			b.ReportMetric(float64(dec)/1e6/float64(b.N), "decode-ms/op")
			b.ReportMetric(float64(moved)/(1<<20), "kv-MiB/op")
		})
		b.Run(fmt.Sprintf("tokens=%d/recompute", n), func(b *testing.B) {
			decode := newWorkerOf(b, mcfg, "")
			for i := 0; b.Loop(); i++ {
				firstToken(b, decode, sched.Request{Prompt: prompt(n, uint32(1000*n+i)), MaxTokens: 1})
			}
		})
	}
}

// firstToken runs req to its end (its first token, MaxTokens 1) and
// returns the last Output.
func firstToken(b *testing.B, w *worker, req sched.Request) sched.Output {
	b.Helper()
	ch, err := w.Generate(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	var last sched.Output
	for last = range ch {
	}
	if last.Err != nil {
		b.Fatal(last.Err)
	}
	return last
}

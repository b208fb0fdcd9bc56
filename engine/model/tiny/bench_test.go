package tiny

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model"
)

// BenchmarkPrefill is the default model's (o200k vocabulary) prefill of a
// prompt of each length from nothing cached, reporting tokens/s: the rate
// that restoring KV from a cache tier competes with.
func BenchmarkPrefill(b *testing.B) {
	m := newModel(b, Config{})
	for _, n := range []int{16, 128, 512, 2048} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			toks := prompt(n, 1)
			batch := []model.Seq{{Tokens: toks}}
			for b.Loop() {
				if _, err := m.Prefill(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkDecode is the default model's decode step for a batch of
// sequences each holding context tokens, reporting generated tokens/s.
func BenchmarkDecode(b *testing.B) {
	m := newModel(b, Config{})
	for _, tc := range []struct{ batch, context int }{{1, 128}, {1, 1024}, {8, 1024}} {
		b.Run(fmt.Sprintf("batch=%d/context=%d", tc.batch, tc.context), func(b *testing.B) {
			toks := prompt(tc.context, 2)
			res, err := m.Prefill(context.Background(), []model.Seq{{Tokens: toks[:tc.context-1]}})
			if err != nil {
				b.Fatal(err)
			}
			batch := make([]model.Seq, tc.batch)
			for i := range batch {
				batch[i] = model.Seq{Tokens: toks, Cached: tc.context - 1, Prefix: res.Blocks[0]}
			}
			for b.Loop() {
				if _, err := m.Decode(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tc.batch*b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

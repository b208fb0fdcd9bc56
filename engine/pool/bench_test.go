package pool

import (
	"fmt"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// BenchmarkPool measures one request's cycle through pools of growing size
// — Find its cached prefix, Allocate the rest, Cache its blocks, Free them —
// and reports the cost per block; constant across sizes means O(1) per
// block. Every request shares half its blocks with the previous one, and
// the pool is full of cached blocks, so each Allocate evicts.
func BenchmarkPool(b *testing.B) {
	const bt, perReq = 16, 32
	for _, blocks := range []int{1 << 10, 1 << 14, 1 << 18} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			p, err := New(Config{Blocks: blocks, BlockTokens: bt})
			if err != nil {
				b.Fatal(err)
			}
			// Fill the pool with cached blocks of other sequences.
			for i := 0; i < blocks/perReq; i++ {
				cycle(b, p, seq(1_000_000+i*perReq*bt, perReq*bt))
			}
			tokens := seq(0, perReq*bt)
			b.ResetTimer()
			for i := range b.N {
				// The second half of the prompt changes every request.
				for j := perReq / 2 * bt; j < len(tokens); j++ {
					tokens[j] = uint32(i*len(tokens) + j)
				}
				cycle(b, p, tokens)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perReq), "ns/block")
		})
	}
}

func cycle(b *testing.B, p *Pool, tokens []uint32) {
	bt := p.BlockTokens()
	hs := index.AppendHashes(nil, uint64(ns), tokens, bt)
	found := p.Find(ns, hs, len(tokens))
	fresh, err := p.Allocate(len(hs) - len(found))
	if err != nil {
		b.Fatal(err)
	}
	table := append(found, fresh...)
	if _, err := p.Cache(ns, table, tokens); err != nil {
		b.Fatal(err)
	}
	if err := p.Free(table); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFind measures a prefix lookup that hits every block, without
// hashing the tokens (done once, outside the loop), and gives the blocks
// back.
func BenchmarkFind(b *testing.B) {
	const bt, perReq = 16, 32
	p, err := New(Config{Blocks: 1 << 14, BlockTokens: bt})
	if err != nil {
		b.Fatal(err)
	}
	tokens := seq(0, perReq*bt)
	cycle(b, p, tokens)
	hs := index.AppendHashes(nil, uint64(ns), tokens, bt)
	b.ResetTimer()
	for range b.N {
		got := p.Find(ns, hs, len(tokens))
		if len(got) != perReq {
			b.Fatalf("found %d blocks, want %d", len(got), perReq)
		}
		if err := p.Free(got); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perReq), "ns/block")
}

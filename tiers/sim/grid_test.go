package sim

import (
	"context"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/trace"
)

func TestGridSpecs(t *testing.T) {
	single := Grid{Policies: []string{"lru", "belady"}, Tokens: []int64{10, 20}}.Specs()
	want := []Spec{SingleTier{"lru", 10}, SingleTier{"lru", 20}, SingleTier{"belady", 10}, SingleTier{"belady", 20}}
	if !slices.Equal(single, want) {
		t.Fatalf("single-tier grid: %v, want %v", single, want)
	}
	// Multi-tier: Belady has no hierarchy, so it runs as one tier of DRAM
	// + SSD, the bound for the pair.
	multi := Grid{Policies: []string{"prefix", "belady"}, Tokens: []int64{10}, SSDTokens: []int64{30, 50}, AdmitMinSeen: 2}.Specs()
	want = []Spec{
		MultiTier{Policy: "prefix", DRAMTokens: 10, SSDTokens: 30, AdmitMinSeen: 2},
		MultiTier{Policy: "prefix", DRAMTokens: 10, SSDTokens: 50, AdmitMinSeen: 2},
		SingleTier{"belady", 40}, SingleTier{"belady", 60},
	}
	if !slices.Equal(multi, want) {
		t.Fatalf("multi-tier grid: %v, want %v", multi, want)
	}
}

func TestBeladyBoundsPairSameTotalCapacity(t *testing.T) {
	var reqs []trace.Request
	for i := range 50 {
		reqs = append(reqs, trace.Request{InputLength: 48, HashIDs: []uint64{uint64(i % 7), uint64(i%7) + 100, uint64(i % 11)}})
	}
	w, err := NewWorkload(reqs, 16)
	if err != nil {
		t.Fatal(err)
	}
	g := Grid{Policies: []string{"lru", "belady"}, Tokens: []int64{64}, SSDTokens: []int64{64, 128}}
	res, err := Run(context.Background(), w, g.Specs(), nil)
	if err != nil {
		t.Fatal(err)
	}
	bounds := BeladyBounds(res)
	for i, r := range res {
		b := bounds[i]
		if b == nil || TotalTokens(b.Spec) != TotalTokens(r.Spec) || b.Spec.(SingleTier).Policy != "belady" {
			t.Fatalf("%v: bound %v, want Belady at %d tokens", r.Spec, b, TotalTokens(r.Spec))
		}
		if r.HitBlocks > b.HitBlocks {
			t.Errorf("%v hits %d blocks, more than its bound's %d", r.Spec, r.HitBlocks, b.HitBlocks)
		}
	}
	if got := BeladyBounds(res[:2]); got[0] != nil || got[1] != nil {
		t.Errorf("without Belady the bounds are %v, want none", got)
	}
}

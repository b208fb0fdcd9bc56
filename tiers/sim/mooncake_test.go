package sim

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/kvstrata/kvstrata/trace"
)

// These tests cross-check the simulator against figures known from outside
// it, on the Mooncake traces kept in testdata/traces (see its README).

func loadMooncake(t *testing.T, name string) *Workload {
	t.Helper()
	reqs, err := trace.ReadFile(filepath.Join("..", "..", "testdata", "traces", name))
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(reqs, DefaultBlockTokens)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func TestSingleTierLRUMatchesTheReferenceHitRates(t *testing.T) {
	w := loadMooncake(t, "conversation_trace.jsonl")
	for _, c := range []struct {
		capacity int64
		want     float64 // token hit rate
	}{
		{1e6, 0.054},
		{1e7, 0.291},
	} {
		r, err := Replay(context.Background(), w, SingleTier{"lru", c.capacity})
		if err != nil {
			t.Fatal(err)
		}
		if !within(r.TokenHitRate(), c.want, 0.0005) {
			t.Errorf("LRU at %.0e tokens: token hit rate %.4f, want %.3f", float64(c.capacity), r.TokenHitRate(), c.want)
		}
	}
}

func TestAnUnboundedCacheMatchesTheTraceFacts(t *testing.T) {
	for _, c := range []struct {
		name                 string
		refs, distinct       int
		blockRate, tokenRate float64
	}{
		{"conversation_trace.jsonl", 288500, 182790, 0.366, 0.374},
		{"synthetic_trace.jsonl", 121877, 43924, 0.640, 0.651},
	} {
		w := loadMooncake(t, c.name)
		if w.Blocks() != int64(c.refs) || w.DistinctBlocks() != c.distinct {
			t.Errorf("%s: %d block references, %d distinct; want %d and %d", c.name, w.Blocks(), w.DistinctBlocks(), c.refs, c.distinct)
		}
		// Room for every distinct block: nothing is ever evicted, whatever
		// the policy.
		r, err := Replay(context.Background(), w, SingleTier{"lru", int64(w.DistinctBlocks()) * DefaultBlockTokens})
		if err != nil {
			t.Fatal(err)
		}
		if r.Evicted != 0 || r.Rejected != 0 {
			t.Errorf("%s: %d evicted, %d rejected with room for every block", c.name, r.Evicted, r.Rejected)
		}
		if !within(r.BlockHitRate(), c.blockRate, 0.0005) || !within(r.TokenHitRate(), c.tokenRate, 0.0005) {
			t.Errorf("%s unbounded: block hit rate %.4f, token hit rate %.4f; want %.3f and %.3f",
				c.name, r.BlockHitRate(), r.TokenHitRate(), c.blockRate, c.tokenRate)
		}
	}
}

func TestBeladyBoundsTheOnlinePoliciesOnTheTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("replays both traces through every policy")
	}
	// The smaller trace keeps this quick under -race; `kvctl sim` runs
	// the full matrix on both.
	for _, name := range []string{"synthetic_trace.jsonl"} {
		w := loadMooncake(t, name)
		capacities := []int64{1e5, 1e6, 3e6, 1e7}
		var specs []Spec
		for _, p := range Policies {
			for _, c := range capacities {
				specs = append(specs, SingleTier{p, c})
			}
		}
		rs, err := Run(context.Background(), w, specs, nil)
		if err != nil {
			t.Fatal(err)
		}
		belady := map[int64]Result{}
		for _, r := range rs {
			if s := r.Spec.(SingleTier); s.Policy == "belady" {
				belady[s.CapacityTokens] = r
			}
		}
		for _, r := range rs {
			b := belady[r.Spec.(SingleTier).CapacityTokens]
			if r.HitBlocks > b.HitBlocks || r.HitTokens > b.HitTokens {
				t.Errorf("%s: %v hits %d blocks (%d tokens), above Belady's %d (%d)", name, r.Spec, r.HitBlocks, r.HitTokens, b.HitBlocks, b.HitTokens)
			}
		}
	}
}

package sim

import (
	"context"
	"strings"
	"testing"
)

// TestMultiTierSitsBetweenItsTiers replays the conversation trace through a
// DRAM of 1e6 tokens over an SSD of 3e6: it must hit more than the DRAM
// alone and, since a promoted block keeps its SSD copy, no more than one
// tier of both capacities.
func TestMultiTierSitsBetweenItsTiers(t *testing.T) {
	w := loadMooncake(t, "conversation_trace.jsonl")
	rs, err := Run(context.Background(), w, []Spec{
		SingleTier{Policy: "lru", CapacityTokens: 1e6},
		MultiTier{Policy: "lru", DRAMTokens: 1e6, SSDTokens: 3e6},
		SingleTier{Policy: "lru", CapacityTokens: 4e6},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dram, multi, both := rs[0].TokenHitRate(), rs[1].TokenHitRate(), rs[2].TokenHitRate()
	if !(dram < multi && multi <= both+1e-9) {
		t.Fatalf("hit rates: dram alone %.4f, dram+ssd %.4f, one tier of both %.4f", dram, multi, both)
	}
	m := rs[1]
	if len(m.Tiers) != 2 || m.Tiers[0].HitBlocks+m.Tiers[1].HitBlocks != m.HitBlocks {
		t.Fatalf("per-tier hits %+v do not add up to %d", m.Tiers, m.HitBlocks)
	}
	if m.Tiers[1].Demotions == 0 || m.Tiers[0].Promotions == 0 || m.Tiers[1].HitBlocks == 0 {
		t.Fatalf("no movement between tiers: %+v", m.Tiers)
	}
	t.Logf("dram %.4f, dram+ssd %.4f (dram %.4f + ssd %.4f of blocks), single tier of both %.4f",
		dram, multi, m.Tiers[0].BlockHitRate(m), m.Tiers[1].BlockHitRate(m), both)
}

func TestMultiTierValidation(t *testing.T) {
	err := MultiTier{Policy: "belady", DRAMTokens: 100, SSDTokens: -1, AdmitMinSeen: 99}.Validate(512)
	if err == nil {
		t.Fatal("bad spec accepted")
	}
	for _, want := range []string{"unknown policy", "dram capacity of 100 tokens", "ssd capacity of -1", "admit-min-seen 99"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %q", err, want)
		}
	}
}

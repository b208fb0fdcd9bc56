package tiers_test

import (
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// A put that finds DRAM full makes room by dropping a block the SSD holds
// already rather than by demoting one itself: the least recent block, put
// and never demoted, stays in DRAM for the mover to demote, and the put
// writes nothing to the SSD.
func TestAPutThatFindsDRAMFullDropsABlockHeldBelowRatherThanDemote(t *testing.T) {
	h := twoLevels(t, 2, 8, nil) // LRU: block 1 is the first victim
	put(t, h, 1)
	put(t, h, 2)
	if err := h.Demote(index.TierDRAM, key(2)); err != nil {
		t.Fatal(err)
	}
	if _, _, kind, err := h.Get(key(2), nil); err != nil || kind != index.TierSSD {
		t.Fatalf("get 2: %v from %v, want a hit below, promoted", err, kind)
	}
	if w := where(t, h, 2); w != index.TierDRAM.String() {
		t.Fatalf("block 2 is in %s after its hit, want DRAM", w)
	}
	demoted := h.Stats().Levels[1].Demotions
	put(t, h, 3)
	if got := h.Stats().Levels[1].Demotions - demoted; got != 0 {
		t.Errorf("the put demoted %d blocks, want none", got)
	}
	for i, want := range map[int]index.TierKind{1: index.TierDRAM, 2: index.TierSSD, 3: index.TierDRAM} {
		if w := where(t, h, i); w != want.String() {
			t.Errorf("block %d is in %s, want %v", i, w, want)
		}
	}
	// With no block held below left, the next put demotes the first victim.
	put(t, h, 4)
	if got := h.Stats().Levels[1].Demotions - demoted; got != 1 {
		t.Errorf("%d demotions after the second put, want 1", got)
	}
	if w := where(t, h, 1); w != index.TierSSD.String() {
		t.Errorf("block 1 is in %s after the second put, want SSD", w)
	}
}

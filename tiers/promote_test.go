package tiers_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
)

// getOnlyTier stands in for a tier whose reads are Gets and nothing else
// (ssd): a DRAM tier with its extras hidden. It records the buffer each
// Get was handed and can be told to report the block corrupt from its nth
// Get on, as a tier whose disk went bad between two reads would.
type getOnlyTier struct {
	tiers.Tier

	mu          sync.Mutex
	dsts        [][]byte
	corruptFrom int // 0: never
}

func (g *getOnlyTier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	g.mu.Lock()
	g.dsts = append(g.dsts, dst)
	corrupt := g.corruptFrom > 0 && len(g.dsts) >= g.corruptFrom
	g.mu.Unlock()
	if corrupt {
		_ = g.Tier.Delete(key) // a tier drops a block that fails its checksum
		return dst, index.Header{}, fmt.Errorf("getOnlyTier: %w", tiers.ErrCorrupt)
	}
	return g.Tier.Get(key, dst)
}

// dramOverGets stacks a DRAM tier over a getOnlyTier labelled SSD.
func dramOverGets(t *testing.T) (*tiers.Hierarchy, *dram.Tier, *getOnlyTier) {
	t.Helper()
	top, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	below, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	g := &getOnlyTier{Tier: below}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: top, HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: g, HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, top, g
}

// within reports whether b's bytes lie inside region.
func within(b, region []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(region)))
	return p >= lo && p+uintptr(cap(b)) <= lo+uintptr(len(region))
}

// A block promoted out of a tier read by Get into a tier written in place
// is read straight into the room reserved for it: no buffer in between.
func TestPromotionGetsStraightIntoTheReservationAbove(t *testing.T) {
	h, top, g := dramOverGets(t)
	want := put(t, h, 1)
	if err := h.Demote(index.TierDRAM, key(1)); err != nil {
		t.Fatal(err)
	}
	got, _, kind, err := h.Get(key(1), nil) // served from below; promotes inline
	if err != nil || kind != index.TierSSD || !bytes.Equal(got, want) {
		t.Fatalf("the read: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
	}
	if w := where(t, h, 1); w != index.TierDRAM.String() {
		t.Fatalf("after the read the block is in %s, want it promoted", w)
	}
	if len(g.dsts) != 2 {
		t.Fatalf("%d Gets below, want the read's and the promotion's", len(g.dsts))
	}
	if dst := g.dsts[1]; len(dst) != 0 || cap(dst) < blockSize || !within(dst, top.HostArena()) {
		t.Fatalf("the promotion's Get was handed len %d cap %d, inside DRAM's arena %v", len(dst), cap(dst), within(dst, top.HostArena()))
	}
	back, m, err := top.Get(key(1), nil)
	if err != nil || !bytes.Equal(back, want) || m.Sum != index.Checksum(want) {
		t.Fatalf("DRAM's copy: %v, equal %v", err, bytes.Equal(back, want))
	}
}

// A promotion whose read finds the block corrupt aborts the reservation:
// the level above keeps nothing of it, its room is free, and the block is
// gone (a miss, as any corrupt copy that was the last one).
func TestACorruptPromotionLeavesTheLevelAboveAsItWas(t *testing.T) {
	h, top, g := dramOverGets(t)
	put(t, h, 1)
	if err := h.Demote(index.TierDRAM, key(1)); err != nil {
		t.Fatal(err)
	}
	g.corruptFrom = 2 // the served read is sound; the promotion's is not
	if _, _, _, err := h.Get(key(1), nil); err != nil {
		t.Fatal(err)
	}
	if used := top.Stats().Used; used != 0 {
		t.Fatalf("DRAM holds %d bytes after an aborted promotion", used)
	}
	if _, _, _, err := h.Get(key(1), nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("a get after the corrupt promotion: %v, want not found", err)
	}
}

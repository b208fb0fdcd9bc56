package tiers_test

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/ssd"
)

// fullSSD opens a real SSD tier whose file system has no room for it: its
// disk reserve is larger than any disk, so every Put is refused with
// ErrNoSpace.
func fullSSD(t *testing.T) tiers.Tier {
	t.Helper()
	s, err := ssd.Open(ssd.Config{Dir: t.TempDir(), Capacity: 1 << 30, MaxBlockSize: blockSize, DiskReserve: 1 << 60,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A DRAM victim passes over an SSD whose disk is full into the level below
// it, and an operator's demotion does too; the SSD shows as degraded.
func TestVictimsPassOverAFullDiskToTheLevelBelow(t *testing.T) {
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 4), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: fullSSD(t), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierS3, Tier: newDRAM(t, 16), HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	for i := 1; i <= 6; i++ {
		put(t, h, i)
	}
	for i, want := range map[int]string{1: "s3", 2: "s3", 3: "dram", 6: "dram"} {
		if got := where(t, h, i); got != want {
			t.Errorf("block %d in %s, want %s", i, got, want)
		}
	}
	if err := h.Demote(index.TierDRAM, key(3)); err != nil {
		t.Fatalf("demote past a full SSD: %v", err)
	}
	if got := where(t, h, 3); got != "s3" {
		t.Errorf("demoted block in %s, want s3", got)
	}
	s := h.Stats()
	if s.Levels[2].Demotions != 3 || s.Levels[1].Demotions != 0 || s.Levels[0].Drops != 0 {
		t.Errorf("stats %+v", s.Levels)
	}
	if s.Levels[1].Degraded == nil || s.Levels[1].Unavailable != nil {
		t.Errorf("full SSD: degraded %v, unavailable %v; want degraded and available", s.Levels[1].Degraded, s.Levels[1].Unavailable)
	}
}

// With nothing below a full SSD, DRAM victims are dropped and puts go on;
// an operator's demotion fails with ErrNoSpace at once.
func TestAFullDiskAtTheBottomDropsVictims(t *testing.T) {
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 4), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: fullSSD(t), HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	for i := 1; i <= 6; i++ {
		put(t, h, i)
	}
	if got := where(t, h, 1); got != "gone" {
		t.Errorf("block 1 in %s, want dropped", got)
	}
	if s := h.Stats(); s.Levels[0].Drops != 2 {
		t.Errorf("dram drops = %d, want 2", s.Levels[0].Drops)
	}
	if err := h.Demote(index.TierDRAM, key(6)); !errors.Is(err, tiers.ErrNoSpace) {
		t.Errorf("demote into a full SSD: %v, want ErrNoSpace", err)
	}
	if got := where(t, h, 6); got != "dram" {
		t.Errorf("block whose demotion failed in %s, want dram", got)
	}
}

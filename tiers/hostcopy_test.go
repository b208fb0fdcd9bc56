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

// copierTier stands in for a device tier (hbm) over a real DRAM tier: it
// has none of DRAM's extras but HostCopier, counts how blocks leave and
// enter it, and can be told to fail its next copy out halfway, as a DMA
// that fails on the device does.
type copierTier struct {
	tiers.Tier // a DRAM tier, its extras hidden

	mu       sync.Mutex
	gets     int
	copyOuts int
	failNext bool
	puts     [][]byte // the value of each Put, as handed in
}

var _ tiers.HostCopier = (*copierTier)(nil)

func (c *copierTier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	c.mu.Lock()
	c.gets++
	c.mu.Unlock()
	return c.Tier.Get(key, dst)
}

func (c *copierTier) Put(m index.Header, value []byte) error {
	c.mu.Lock()
	c.puts = append(c.puts, value)
	c.mu.Unlock()
	return c.Tier.Put(m, value)
}

func (c *copierTier) CopyOut(key index.Key, dst []byte) (index.Header, error) {
	c.mu.Lock()
	c.copyOuts++
	fail := c.failNext
	c.failNext = false
	c.mu.Unlock()
	m, err := c.Tier.Stat(key)
	if err != nil {
		return m, err
	}
	if int(m.Size) != len(dst) {
		return index.Header{}, fmt.Errorf("%w: %d bytes into %d", tiers.ErrInvalid, m.Size, len(dst))
	}
	got, m, err := c.Tier.Get(key, dst[:0]) // fits: Get appends in place
	if err != nil {
		return m, err
	}
	if unsafe.SliceData(got) != unsafe.SliceData(dst) {
		return m, errors.New("copierTier: Get did not append in place")
	}
	if fail {
		clear(dst[len(dst)/2:])
		return index.Header{}, errors.New("copierTier: the copy failed halfway")
	}
	return m, nil
}

// deviceOverDRAM stacks a copierTier labelled HBM over a DRAM tier.
func deviceOverDRAM(t *testing.T) (*tiers.Hierarchy, *copierTier, *dram.Tier) {
	t.Helper()
	top, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	c := &copierTier{Tier: top}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: c, HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierDRAM, Tier: d, HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, c, d
}

// A block demoted out of a tier that copies into host memory goes straight
// into the room the level below reserved for it: no Get, no buffer.
func TestDemotionFromAHostCopierFillsTheReservationBelow(t *testing.T) {
	h, c, d := deviceOverDRAM(t)
	want := put(t, h, 1)
	if err := h.Demote(index.TierHBM, key(1)); err != nil {
		t.Fatal(err)
	}
	if c.gets != 0 || c.copyOuts != 1 {
		t.Fatalf("the demotion made %d Gets and %d CopyOuts; want 0 and 1", c.gets, c.copyOuts)
	}
	got, m, err := d.Get(key(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || m.Sum != index.Checksum(want) {
		t.Fatal("the block came down different")
	}
	if w := where(t, h, 1); w != index.TierDRAM.String() {
		t.Fatalf("after the demotion the block is in %s", w)
	}
}

// A copy that fails aborts the reservation: the level below holds nothing
// of it, its room is free, and the block is still served, whole, from
// above.
func TestAFailedCopyOutAbortsTheReservationAndLosesNothing(t *testing.T) {
	h, c, d := deviceOverDRAM(t)
	want := put(t, h, 1)
	c.failNext = true
	if err := h.Demote(index.TierHBM, key(1)); err == nil {
		t.Fatal("a demotion whose copy failed succeeded")
	}
	if st := d.Stats(); st.Used != 0 || st.Blocks != 0 {
		t.Fatalf("DRAM after the failed copy: %+v; want nothing used", st)
	}
	if _, err := d.Stat(key(1)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("DRAM's Stat of the block: %v; want ErrNotFound", err)
	}
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil {
		t.Fatal(err)
	}
	if kind != index.TierHBM || !bytes.Equal(got, want) {
		t.Fatalf("after the failed demotion the block came from %v, equal %v", kind, bytes.Equal(got, want))
	}
	if err := h.Demote(index.TierHBM, key(1)); err != nil {
		t.Fatalf("the demotion again: %v", err)
	}
	if got, _, err := d.Get(key(1), nil); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the second demotion: %v, equal %v", err, bytes.Equal(got, want))
	}
}

// Promotion out of DRAM hands the device tier the arena's own bytes (which
// a device tier has pinned), not a copy of them on the heap.
func TestPromotionHandsTheDeviceTierTheArenasBytes(t *testing.T) {
	h, c, d := deviceOverDRAM(t)
	want := put(t, h, 1)
	if err := h.Demote(index.TierHBM, key(1)); err != nil {
		t.Fatal(err)
	}
	c.puts = nil
	if ok, err := h.PromoteTo(index.TierHBM, key(1)); !ok || err != nil {
		t.Fatalf("PromoteTo: %v, %v", ok, err)
	}
	if len(c.puts) != 1 {
		t.Fatalf("the promotion made %d Puts; want 1", len(c.puts))
	}
	arena := d.HostArena()
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(c.puts[0]))), uintptr(unsafe.Pointer(unsafe.SliceData(arena)))
	if p < lo || p+uintptr(len(c.puts[0])) > lo+uintptr(len(arena)) {
		t.Fatal("the promotion copied the block out of the arena before handing it up")
	}
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil || kind != index.TierHBM || !bytes.Equal(got, want) {
		t.Fatalf("after the promotion: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
	}
}

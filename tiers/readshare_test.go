package tiers_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/ssd"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// countedSSD is an SSD tier that counts the reads of blocks made through
// Get and GetPooled.
type countedSSD struct {
	*ssd.Tier
	gets, pooled atomic.Int64
}

func (c *countedSSD) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	c.gets.Add(1)
	return c.Tier.Get(key, dst)
}

func (c *countedSSD) GetPooled(key index.Key) ([]byte, *bufpool.Buffer, index.Header, error) {
	c.pooled.Add(1)
	return c.Tier.GetPooled(key)
}

// dramOverCountedSSD stacks a DRAM tier over a countedSSD, the mover
// inline, and leaves one 64 KiB block, returned, in the SSD only.
func dramOverCountedSSD(t *testing.T) (*tiers.Hierarchy, *countedSSD, index.Header, []byte) {
	t.Helper()
	const size = 64 << 10 // kept in a block file
	top, err := dram.New(dram.Config{Capacity: 4 * size, MaxBlockSize: size})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ssd.Open(ssd.Config{Dir: t.TempDir(), Capacity: 1 << 30, MaxBlockSize: size})
	if err != nil {
		t.Fatal(err)
	}
	below := &countedSSD{Tier: st}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: top},
		{Kind: index.TierSSD, Tier: below},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	m, want := tiertest.Block(1, size)
	if err := h.Put(m, want); err != nil {
		t.Fatal(err)
	}
	if err := h.Demote(index.TierDRAM, m.Key); err != nil {
		t.Fatal(err)
	}
	return h, below, m, want
}

// A single SSD hit read through ReadManyPooled (a data-plane get of a
// block below DRAM) is read once, into a buffer of the SSD tier's pool:
// its promotion into DRAM copies the bytes the reader got rather than
// reading the block again.
func TestAPooledSSDHitIsReadOnceForTheReaderAndItsPromotion(t *testing.T) {
	h, below, m, want := dramOverCountedSSD(t)
	calls := 0
	err := h.ReadManyPooled(context.Background(), []index.Key{m.Key},
		func(_ int, v []byte, ref *bufpool.Buffer, got index.Header, kind index.TierKind, err error) {
			calls++
			if err != nil || kind != index.TierSSD || got != m || !bytes.Equal(v, want) {
				t.Errorf("the read: %v from %v, %+v, equal %v", err, kind, got, bytes.Equal(v, want))
			}
			ref.Release()
		})
	if err != nil || calls != 1 {
		t.Fatalf("ReadManyPooled: %v, %d calls", err, calls)
	}
	if _, kind, err := h.Stat(m.Key); err != nil || kind != index.TierDRAM {
		t.Fatalf("after the read the block is in %v (%v), want it promoted into DRAM", kind, err)
	}
	if g, p := below.gets.Load(), below.pooled.Load(); g+p != 1 {
		t.Fatalf("the SSD was read %d times (%d Gets, %d GetPooled), want once", g+p, g, p)
	}
	got, _, kind, err := h.Get(m.Key, nil)
	if err != nil || kind != index.TierDRAM || !bytes.Equal(got, want) {
		t.Fatalf("DRAM's copy: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
	}
}

// A View of a block below DRAM reads it once, into a buffer of the SSD
// tier's pool that the View holds until it is released and its promotion
// shares.
func TestAViewOfAnSSDBlockReadsItOnceIntoAPooledBuffer(t *testing.T) {
	h, below, m, want := dramOverCountedSSD(t)
	v, kind, err := h.View(m.Key, time.Minute)
	if err != nil || kind != index.TierSSD || v.Meta() != m || !bytes.Equal(v.Bytes(), want) {
		t.Fatalf("the view: %v from %v", err, kind)
	}
	if err := v.Release(); err != nil {
		t.Fatal(err)
	}
	if err := v.Release(); err != nil { // a second Release gives back nothing more
		t.Fatal(err)
	}
	if _, kind, err := h.Stat(m.Key); err != nil || kind != index.TierDRAM {
		t.Fatalf("after the view the block is in %v (%v), want it promoted into DRAM", kind, err)
	}
	if g, p := below.gets.Load(), below.pooled.Load(); g != 0 || p != 1 {
		t.Fatalf("the SSD was read with %d Gets and %d GetPooled, want one GetPooled", g, p)
	}
}

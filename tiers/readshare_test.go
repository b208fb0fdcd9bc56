package tiers_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"

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

// A single SSD hit read through ReadManyPooled (a data-plane get of a
// block below DRAM) is read once, into a buffer of the SSD tier's pool:
// its promotion into DRAM copies the bytes the reader got rather than
// reading the block again.
func TestAPooledSSDHitIsReadOnceForTheReaderAndItsPromotion(t *testing.T) {
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
	calls := 0
	err = h.ReadManyPooled(context.Background(), []index.Key{m.Key},
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
	got, _, err := top.Get(m.Key, nil)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("DRAM's copy: %v, equal %v", err, bytes.Equal(got, want))
	}
}

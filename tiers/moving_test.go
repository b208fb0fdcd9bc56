package tiers_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// A read of a block that is leaving one level while another level keeps
// it must find it in the other level. The fault run once found a block
// "listed but not served" after the cluster had settled: its node's
// directory entry was right, but the node's Get said not found, because
// the read kept going back to the level the mover had just deleted the
// copy from and gave up after four tries.

// gatedTier is a real tier whose Delete of one key, once it has deleted
// the copy, waits until the test lets it go on: it holds the hierarchy at
// the moment the copy is gone from the tier but still recorded.
type gatedTier struct {
	tiers.Tier
	key     index.Key
	deleted chan struct{} // closed once the copy is deleted
	resume  chan struct{} // closed by the test
}

func (g *gatedTier) Delete(key index.Key) error {
	err := g.Tier.Delete(key)
	if key == g.key {
		close(g.deleted)
		<-g.resume
	}
	return err
}

func TestReadFindsTheLowerCopyOfABlockLeavingDRAM(t *testing.T) {
	gate := &gatedTier{Tier: newDRAM(t, 4), key: key(1), deleted: make(chan struct{}), resume: make(chan struct{})}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: gate, HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: newDRAM(t, 8), HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	want := put(t, h, 1)

	demoted := make(chan error, 1)
	go func() { demoted <- h.Demote(index.TierDRAM, key(1)) }() // copies it to the SSD, then drops the DRAM copy
	select {
	case <-gate.deleted:
	case err := <-demoted:
		t.Fatalf("demote returned before deleting the DRAM copy: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("demote did not delete the DRAM copy within 10s")
	}

	// The DRAM copy is gone, the SSD copy is there: both a Get and a View
	// (the data plane's read) serve the block from the SSD.
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil || !bytes.Equal(got, want) || kind != index.TierSSD {
		t.Errorf("get while the DRAM copy is being dropped: %v from %v, want the block from the ssd", err, kind)
	}
	v, kind, err := h.View(key(1), time.Minute)
	if err != nil || !bytes.Equal(v.Bytes(), want) || kind != index.TierSSD {
		t.Errorf("view while the DRAM copy is being dropped: %v from %v, want the block from the ssd", err, kind)
	}
	if err == nil {
		_ = v.Release()
	}

	close(gate.resume)
	if err := <-demoted; err != nil {
		t.Fatal(err)
	}
	if got := where(t, h, 1); got != "ssd" {
		t.Fatalf("block 1 in %s after the demotion, want ssd", got)
	}
}

// A block whose only copy is being dropped reads as not found once the
// drop is done, not as an error and without hanging.
func TestReadOfABlockBeingDroppedWaitsForTheDrop(t *testing.T) {
	gate := &gatedTier{Tier: newDRAM(t, 4), key: key(1), deleted: make(chan struct{}), resume: make(chan struct{})}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: gate},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	put(t, h, 1)
	deleted := make(chan error, 1)
	go func() { deleted <- h.Delete(key(1)) }()
	<-gate.deleted
	got := make(chan error, 1)
	go func() {
		_, _, _, err := h.Get(key(1), nil)
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the Get start while the copy is recorded but gone
	close(gate.resume)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("get of a dropped block: %v, want ErrNotFound", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("get of a dropped block did not answer within 10s of the drop")
	}
}

// The same race with the real mover: readers keep fetching blocks that
// every one of them holds in the SSD, while each SSD hit is promoted into a
// DRAM of four blocks and so drops another block's DRAM copy. No read may
// miss.
func TestReadsNeverMissBlocksTheSSDHoldsWhileDRAMChurns(t *testing.T) {
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 4)},
		{Kind: index.TierSSD, Tier: newDRAM(t, 64)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	const blocks = 32
	for i := range blocks {
		put(t, h, i)
		if err := h.Demote(index.TierDRAM, key(i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var misses []string
	for r := range 4 {
		wg.Go(func() {
			for n := range 5000 {
				i := (n*7 + r*13) % blocks
				if _, _, _, err := h.Get(key(i), nil); err != nil {
					mu.Lock()
					misses = append(misses, fmt.Sprintf("block %d: %v", i, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(misses) > 0 {
		t.Fatalf("%d of 20000 reads of blocks held in the SSD missed, first: %s", len(misses), misses[0])
	}
}

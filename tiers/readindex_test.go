package tiers_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// TestAGetIsServedWhileAWriterHoldsTheHierarchy holds the hierarchy's lock
// in a Put, whose listener (Config.OnChange, called under the lock) waits
// until the test lets it go, and reads another block meanwhile. A read
// that took the lock, even shared, would wait for the listener, which the
// test lets go only after the read: the test would hang until go test's
// timeout.
func TestAGetIsServedWhileAWriterHoldsTheHierarchy(t *testing.T) {
	var (
		armed   bool
		entered = make(chan struct{})
		letGo   = make(chan struct{})
	)
	h, err := tiers.New(tiers.Config{
		Levels: []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: newDRAM(t, 8)}},
		OnChange: func(c index.Change) {
			if armed && c.Kind == index.ChangeStored && c.Key == key(2) {
				close(entered)
				<-letGo
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	want := put(t, h, 1)
	armed = true // read by the listener only after the Put below starts
	m2, b2 := tiertest.Block(2, blockSize)
	putErr := make(chan error, 1)
	go func() { putErr <- h.Put(m2, b2) }()
	<-entered // the Put holds the hierarchy's lock now

	got, _, kind, err := h.Get(key(1), nil)
	v, vkind, verr := h.View(key(1), time.Minute)
	close(letGo)
	if err != nil || !bytes.Equal(got, want) || kind != index.TierDRAM {
		t.Errorf("get while a writer held the hierarchy: %v from %v, want the block from dram", err, kind)
	}
	if verr != nil || !bytes.Equal(v.Bytes(), want) || vkind != index.TierDRAM {
		t.Errorf("view while a writer held the hierarchy: %v from %v, want the block from dram", verr, vkind)
	} else {
		_ = v.Release()
	}
	if err := <-putErr; err != nil {
		t.Fatal(err)
	}
}

// TestTheReadIndexFollowsEveryMove runs puts, gets, deletes, operators'
// demotions and promotions, with the mover demoting and promoting, and
// checks that the read index agrees with the hierarchy's entries after.
func TestTheReadIndexFollowsEveryMove(t *testing.T) {
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 8), HighWatermark: 0.75, LowWatermark: 0.5},
		{Kind: index.TierSSD, Tier: newDRAM(t, 24)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 11))
			for range 2000 {
				i := 1 + r.IntN(40)
				var err error
				switch op := r.IntN(20); {
				case op < 6:
					m, b := tiertest.Block(index.Hash(i), 512+r.IntN(blockSize-512))
					err = h.Put(m, b)
				case op < 16:
					var got []byte
					var m index.Header
					got, m, _, err = h.Get(key(i), nil)
					if err == nil && index.Checksum(got) != m.Sum {
						t.Errorf("torn read of %d", i)
					}
				case op < 17:
					err = h.Delete(key(i))
				case op < 18:
					err = h.Demote(index.TierDRAM, key(i))
				case op < 19:
					_, err = h.PromoteTo(index.TierDRAM, key(i))
				default:
					err = h.DeleteFrom(index.TierSSD, key(i))
				}
				if err != nil && !errors.Is(err, tiers.ErrNotFound) && !errors.Is(err, tiers.ErrFull) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	h.Settle()
	if err := tiers.CheckReadIndex(h); err != nil {
		t.Fatal(err)
	}
}

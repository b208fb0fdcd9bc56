package respnode_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

func TestRESPSetNXIsAtomic(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	for round := range 20 {
		key := fmt.Sprintf("lock:%d", round)
		var stored atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				ok, err := s.SetIf(ctx, key, []byte{byte(i)}, false)
				if err != nil {
					t.Error(err)
				}
				if ok {
					stored.Add(1)
				}
			})
		}
		wg.Wait()
		if n := stored.Load(); n != 1 {
			t.Fatalf("round %d: %d of 8 concurrent SET NX stored; want exactly 1", round, n)
		}
	}
}

func TestRESPSetXXStoresOnlyOverAValue(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if ok, err := s.SetIf(ctx, "k", []byte("v"), true); ok || err != nil {
		t.Fatalf("SET XX of a missing key: %v %v", ok, err)
	}
	if err := s.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.SetIf(ctx, "k", []byte("w"), true); !ok || err != nil {
		t.Fatalf("SET XX of a present key: %v %v", ok, err)
	}
	v, release, err := s.View(ctx, "k")
	if err != nil || string(v) != "w" {
		t.Fatalf("after SET XX: %q %v", v, err)
	}
	release()
	if ok, err := s.SetIf(ctx, "k", []byte("x"), false); ok || err != nil {
		t.Fatalf("SET NX of a present key: %v %v", ok, err)
	}
}

// newStore returns the Store of a node with a 64 KiB block limit.
func newStore(t *testing.T) *respnode.Store {
	n := nodetest.Start(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, Inline: true})
	return respnode.New(n.Node)
}

// The record of a SET is hashed while it is copied into the tier: its Sum
// must still be the checksum of the bytes stored, for a value held inline
// and for the chunks and record of one held in parts.
func TestRESPSetStoresTheChecksumOfItsBytes(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, Inline: true})
	s := respnode.New(n.Node)
	ctx := context.Background()
	for _, size := range []int{0, 1, 40 << 10, 64<<10 - 100, 200 << 10} {
		key := fmt.Sprintf("v:%d", size)
		value := make([]byte, size)
		for i := range value {
			value[i] = byte(i*31 + size)
		}
		if err := s.Set(ctx, key, value); err != nil {
			t.Fatalf("SET of %d bytes: %v", size, err)
		}
		checked := 0
		for _, b := range n.Node.Hierarchy().Blocks(func(tiers.BlockInfo) bool { return true }) {
			v, _, err := n.Node.View(b.Key)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := v.Meta().Sum, index.Checksum(v.Bytes()); got != want {
				t.Fatalf("after SET of %d bytes: block %v has Sum %016x, its bytes hash to %016x", size, b.Key, got, want)
			}
			_ = v.Release()
			checked++
		}
		got, release, err := s.View(ctx, key)
		if err != nil || !bytes.Equal(got, value) {
			t.Fatalf("GET of %d bytes: %d bytes back, %v", size, len(got), err)
		}
		release()
		if checked == 0 {
			t.Fatal("no block stored")
		}
	}
}

package respnode_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
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

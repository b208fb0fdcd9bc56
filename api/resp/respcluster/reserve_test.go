package respcluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// reserving is a MemStore with resp.SetReserver: the room is a buffer,
// committed with Set.
type reserving struct{ *resptest.MemStore }

func (s reserving) ReserveSet(ctx context.Context, key string, size int) (resp.PendingSet, bool, error) {
	return &room{s: s, ctx: ctx, key: key, b: make([]byte, size)}, true, nil
}

type room struct {
	s   reserving
	ctx context.Context
	key string
	b   []byte
}

func (r *room) Bytes() []byte { return r.b }
func (r *room) Filled([]byte) {}
func (r *room) Commit() error { return r.s.Set(r.ctx, r.key, r.b) }
func (r *room) Abort()        {}

// A plain SET filled into the room of the local store's reservation
// leaves no older value on another node, as Set does; over a local store
// without the power the server is asked to read the value itself.
func TestAReservedSetLeavesNoOldValueElsewhere(t *testing.T) {
	c := newClusterOf(t, 3, 20*time.Second, func() resp.Store { return reserving{resptest.NewMemStore()} })
	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("old")); err != nil {
		t.Fatal(err)
	}
	p, ok, err := c.stores[2].(resp.SetReserver).ReserveSet(ctx(t), k, 3)
	if err != nil || !ok {
		t.Fatalf("ReserveSet: ok %v, %v", ok, err)
	}
	copy(p.Bytes(), "new")
	p.Filled(p.Bytes())
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.stores {
		mustGet(t, s, k, "new")
	}
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds the old value")
	}

	plain, err := respcluster.New(resptest.NewMemStore(), directory{c, 1}, c.peers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := plain.(resp.SetReserver).ReserveSet(ctx(t), k, 3); ok || err != nil {
		t.Fatalf("ReserveSet over a store without the power: ok %v, %v; want false, nil", ok, err)
	}
}

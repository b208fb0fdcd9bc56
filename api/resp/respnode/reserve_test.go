package respnode_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// fillIn copies value into p's room in pieces of step bytes, telling p of
// each, as the RESP server does as the value arrives.
func fillIn(p resp.PendingSet, value []byte, step int) {
	room := p.Bytes()
	for off := 0; off < len(value); off += step {
		end := min(off+step, len(value))
		copy(room[off:end], value[off:end])
		p.Filled(room[off:end])
	}
}

// A value filled into the room ReserveSet gave is stored as SetWith would
// store it: read back byte for byte, its block's Sum the checksum of its
// bytes, the chunks of the value it replaced deleted.
func TestRESPReserveSetStoresTheFilledValue(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, DRAMBytes: 4 << 20, Inline: true})
	ctx := context.Background()
	if err := s.Set(ctx, "k", randomValue(200<<10, 1)); err != nil { // chunked
		t.Fatal(err)
	}
	value := randomValue(60<<10, 2)
	p, ok, err := s.ReserveSet(ctx, "k", len(value))
	if err != nil || !ok || len(p.Bytes()) != len(value) {
		t.Fatalf("ReserveSet: ok %v, %v", ok, err)
	}
	fillIn(p, value, 7000)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	p.Abort() // a no-op after Commit
	mustGet(t, s, "k", value)
	blocks := n.Hierarchy().Blocks(nil)
	if len(blocks) != 1 {
		t.Fatalf("%d blocks after replacing a chunked value; want its record only", len(blocks))
	}
	v, _, err := n.View(blocks[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Release()
	if got, want := v.Meta().Sum, index.Checksum(v.Bytes()); got != want {
		t.Fatalf("record's Sum %016x, its bytes hash to %016x", got, want)
	}
}

// While its room is being filled, a reserved SET holds up no other writer
// of the key (the calls below would never return if it did); the last to
// commit wins. An aborted one leaves the key as it was, and a value that
// needs chunks is left to SetWith.
func TestRESPReserveSetHoldsTheKeyOnlyToCommit(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, DRAMBytes: 4 << 20, Inline: true})
	ctx := context.Background()
	a, b := bytes.Repeat([]byte("a"), 40<<10), bytes.Repeat([]byte("b"), 40<<10)
	p, ok, err := s.ReserveSet(ctx, "k", len(a))
	if err != nil || !ok {
		t.Fatalf("ReserveSet: ok %v, %v", ok, err)
	}
	fillIn(p, a[:len(a)/2], 4096)
	if err := s.Set(ctx, "k", []byte("other")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "k", []byte("meanwhile")); err != nil {
		t.Fatal(err)
	}
	q, _, err := s.ReserveSet(ctx, "k", len(b))
	if err != nil {
		t.Fatal(err)
	}
	fillIn(q, b, 40<<10)
	fillIn(&offset{p, len(a) / 2}, a[len(a)/2:], 4096)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "k", a)
	q.Abort()
	mustGet(t, s, "k", a)
	if _, ok, err := s.ReserveSet(ctx, "big", 100<<10); ok || err != nil {
		t.Fatalf("ReserveSet of a value over one block: ok %v, %v; want it left to SetWith", ok, err)
	}
	if got := len(n.Hierarchy().Blocks(nil)); got != 1 {
		t.Fatalf("%d blocks; want the record of k alone", got)
	}
}

// offset is p with its room starting off bytes in, to fill the rest of it.
type offset struct {
	resp.PendingSet
	off int
}

func (o *offset) Bytes() []byte { return o.PendingSet.Bytes()[o.off:] }

// A reserved SET whose tenant's quota has no room fails at its commit,
// with the OOM reply's error, and gives its room back.
func TestRESPReserveSetKeepsTheQuota(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 64 << 10}, DRAMBytes: 4 << 20, Inline: true,
		Quotas: tiers.Quotas{index.RESPNamespace.Tenant(): {index.TierDRAM: 16 << 10}}})
	ctx := context.Background()
	p, ok, err := s.ReserveSet(ctx, "k", 40<<10)
	if err != nil || !ok {
		t.Fatalf("ReserveSet: ok %v, %v", ok, err)
	}
	fillIn(p, make([]byte, 40<<10), 40<<10)
	if err := p.Commit(); !errors.Is(err, resp.ErrFull) {
		t.Fatalf("commit over the quota: %v; want ErrFull", err)
	}
	mustMiss(t, s, "k")
	if used := n.Hierarchy().Stats().Levels[0].Used; used != 0 {
		t.Fatalf("DRAM holds %d bytes after a refused SET; want its room given back", used)
	}
}

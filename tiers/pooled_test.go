package tiers_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// restoredFromS3 stacks DRAM over a real object store, with the mover in
// the background as a node runs it, puts n blocks and moves them all down
// into the store's segments.
func restoredFromS3(t *testing.T, n int) (*tiers.Hierarchy, *s3.Tier, [][]byte) {
	t.Helper()
	srv := s3test.Start(t)
	cfg := srv.Config("pooled")
	cfg.SegmentSize = 256 << 10
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	bottom, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 2*n)},
		{Kind: index.TierS3, Tier: bottom, Shared: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	want := make([][]byte, n)
	for i := range n {
		want[i] = put(t, h, i+1)
		if err := h.Demote(index.TierDRAM, key(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bottom.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return h, bottom, want
}

// demoteAll moves every block back out of DRAM: the store still holds them.
func demoteAll(t *testing.T, h *tiers.Hierarchy, n int) {
	t.Helper()
	for i := range n {
		if err := h.Demote(index.TierDRAM, key(i+1)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPooledReadsOutliveBothTheirSendAndTheirPromotion restores blocks
// with ReadManyPooled twice: once holding every block (as a slow send
// would) until the promotions into DRAM are done, once letting each go at
// once (a fast send) before the promotions copy them. Either way each
// holder must see the block's bytes until it lets go — the buffer is
// poisoned on its last release in tests, so a release that came too soon
// shows as wrong bytes, held or promoted.
func TestPooledReadsOutliveBothTheirSendAndTheirPromotion(t *testing.T) {
	const n = 12
	h, bottom, want := restoredFromS3(t, n)
	keys := make([]index.Key, n)
	for i := range keys {
		keys[i] = key(i + 1)
	}

	type held struct {
		v   []byte
		ref *bufpool.Buffer
	}
	hold := make([]held, n)
	err := h.ReadManyPooled(context.Background(), keys, func(i int, v []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error) {
		if err != nil || kind != index.TierS3 || ref == nil {
			t.Errorf("block %d: %v from %v, pooled %v", i, err, kind, ref != nil)
		}
		hold[i] = held{v, ref}
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Settle() // every promotion done and its reference released
	for i, hd := range hold {
		if !bytes.Equal(hd.v, want[i]) {
			t.Fatalf("block %d changed while held, after its promotion", i)
		}
		if where(t, h, i+1) != "dram" {
			t.Fatalf("block %d was not promoted: in %s; %+v", i, where(t, h, i+1), h.Stats())
		}
		hd.ref.Release()
	}
	if s := bottom.S3Stats(); s.ReadBuffers == 0 {
		t.Fatal("ReadManyPooled read into no pooled buffer")
	}

	demoteAll(t, h, n)
	err = h.ReadManyPooled(context.Background(), keys, func(i int, v []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error) {
		if err != nil || !bytes.Equal(v, want[i]) {
			t.Errorf("block %d: %v, or wrong bytes", i, err)
		}
		ref.Release() // sent: the promotion still holds its own reference
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Settle()
	if s := bottom.S3Stats(); s.ReusedBuffers == 0 {
		t.Fatal("the second restore reused no buffer of the first")
	}
	for i := range n {
		got, _, kind, err := h.Get(key(i+1), nil)
		if err != nil || kind != index.TierDRAM || !bytes.Equal(got, want[i]) {
			t.Fatalf("block %d promoted after its send let go: %v from %v, bytes right: %v", i, err, kind, bytes.Equal(got, want[i]))
		}
	}
}

package tiers_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// threeLevels stacks DRAM (2 blocks) over a second arena labelled SSD (2
// blocks) over a real object store, as node id node.
func threeLevels(t *testing.T, srv *s3test.Server, node index.NodeID) (*tiers.Hierarchy, *s3.Tier) {
	t.Helper()
	return threeLevelsPromotingInto(t, srv, node)
}

// threeLevelsPromotingInto is threeLevels whose object store's hits are
// copied into the levels of the given kinds (none: the default, DRAM).
func threeLevelsPromotingInto(t *testing.T, srv *s3test.Server, node index.NodeID, into ...index.TierKind) (*tiers.Hierarchy, *s3.Tier) {
	t.Helper()
	cfg := srv.Config("shared")
	cfg.FlushInterval = 50 * time.Millisecond
	cfg.RequestTimeout = time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	bottom, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Node: node, Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 2), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: newDRAM(t, 2), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierS3, Tier: bottom, Shared: true, PromoteInto: into},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, bottom
}

func TestSSDVictimsGoToTheObjectStoreAndComeBack(t *testing.T) {
	srv := s3test.Start(t)
	h, bottom := threeLevels(t, srv, 1)
	want := map[int][]byte{}
	for i := 1; i <= 8; i++ {
		want[i] = put(t, h, i)
	}
	if where(t, h, 1) != "s3" || where(t, h, 8) != "dram" {
		t.Fatalf("block 1 in %s, block 8 in %s", where(t, h, 1), where(t, h, 8))
	}
	// The object store's copy is cluster-wide: published at AnyNode.
	p := h.Lookup(7, []index.Hash{1, 2, 3, 4})
	if p.Blocks != 4 || p.At(index.Location{Node: index.AnyNode, Tier: index.TierS3}) != 4 {
		t.Fatalf("lookup: %+v", p)
	}
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil || kind != index.TierS3 || !bytes.Equal(got, want[1]) {
		t.Fatalf("get from s3: %v %v", kind, err)
	}
	if where(t, h, 1) != "dram" {
		t.Fatal("s3 hit not promoted")
	}
	if err := bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Another node on the same bucket finds the blocks on a miss.
	other, _ := threeLevels(t, srv, 2)
	got, _, kind, err = other.Get(key(2), nil)
	if err != nil || kind != index.TierS3 || !bytes.Equal(got, want[2]) {
		t.Fatalf("other node's get: %v %v", kind, err)
	}
}

func TestDemoteAndPromoteToMoveCopiesOnDemand(t *testing.T) {
	srv := s3test.Start(t)
	h, _ := threeLevels(t, srv, 1)
	b := put(t, h, 1)
	if err := h.Demote(index.TierDRAM, key(1)); err != nil || where(t, h, 1) != "ssd" {
		t.Fatalf("demote from dram: %v, now in %s", err, where(t, h, 1))
	}
	if err := h.Demote(index.TierSSD, key(1)); err != nil || where(t, h, 1) != "s3" {
		t.Fatalf("demote from ssd: %v, now in %s", err, where(t, h, 1))
	}
	if err := h.Demote(index.TierS3, key(1)); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("demote from the bottom tier: %v", err)
	}
	if copied, err := h.PromoteTo(index.TierDRAM, key(1)); err != nil || !copied || where(t, h, 1) != "dram" {
		t.Fatalf("promote to dram: %v, now in %s", err, where(t, h, 1))
	}
	got, _, _, _ := h.Get(key(1), nil)
	if !bytes.Equal(got, b) {
		t.Fatal("bytes changed on the way down and up")
	}
}

func TestObjectStoreOutageIsUnreachableNotAMissNorAFailure(t *testing.T) {
	srv := s3test.Start(t)
	h, bottom := threeLevels(t, srv, 1)
	for i := 1; i <= 6; i++ {
		put(t, h, i)
	}
	if err := bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	// Blocks only in the object store are cached but out of reach: their
	// gets fail with ErrUnavailable, not ErrNotFound, and at once once the
	// tier is marked down. A block held nowhere is still a plain miss.
	// DRAM keeps serving, and puts keep landing.
	deadline := time.Now().Add(10 * time.Second)
	for bottom.Available() == nil {
		if _, _, kind, err := h.Get(key(1), nil); !errors.Is(err, tiers.ErrUnavailable) || errors.Is(err, tiers.ErrNotFound) || kind != index.TierS3 {
			t.Fatalf("get of an s3 block with s3 down: %v from %v; want ErrUnavailable from s3", err, kind)
		}
		if time.Now().After(deadline) {
			t.Fatal("s3 never marked unavailable")
		}
	}
	before := h.Stats()
	if _, _, _, err := h.Get(key(2), nil); !errors.Is(err, tiers.ErrUnavailable) || errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("get of an s3 block with s3 marked down: %v, want ErrUnavailable", err)
	}
	if _, _, _, err := h.Get(key(99), nil); !errors.Is(err, tiers.ErrNotFound) || errors.Is(err, tiers.ErrUnavailable) {
		t.Fatalf("get of a block held nowhere with s3 down: %v, want ErrNotFound", err)
	}
	after := h.Stats()
	if a, b := after.Levels[2].Detail["request_errors"], before.Levels[2].Detail["request_errors"]; a != b {
		t.Fatalf("a get with s3 marked down still asked the store (%d request errors, was %d)", a, b)
	}
	if n := after.Levels[2].Unreachable - before.Levels[2].Unreachable; n != 1 {
		t.Fatalf("s3's unreachable count grew by %d, want 1", n)
	}
	if n := after.Misses - before.Misses; n != 1 {
		t.Fatalf("misses grew by %d, want 1: only the block held nowhere", n)
	}
	var got []error
	err := h.ReadMany(context.Background(), []index.Key{key(1), key(2), key(99)}, func(i int, _ []byte, _ index.Header, _ index.TierKind, err error) {
		got = append(got, err)
	})
	if err != nil || len(got) != 3 {
		t.Fatalf("ReadMany with s3 down: %v, %d answers", err, len(got))
	}
	var unreachable, missing int
	for _, err := range got {
		switch {
		case errors.Is(err, tiers.ErrUnavailable):
			unreachable++
		case errors.Is(err, tiers.ErrNotFound):
			missing++
		}
	}
	if unreachable != 2 || missing != 1 {
		t.Fatalf("ReadMany with s3 down: %v; want two ErrUnavailable and one ErrNotFound", got)
	}
	if _, _, kind, err := h.Get(key(6), nil); err != nil || kind != index.TierDRAM {
		t.Fatalf("dram block with s3 down: %v %v", kind, err)
	}
	m, b := tiertest.Block(9, blockSize)
	if err := h.Put(m, b); err != nil {
		t.Fatalf("put with s3 down: %v", err)
	}
	if s := h.Stats(); s.Levels[2].Unavailable == nil || s.Levels[2].Detail["request_errors"] == 0 {
		t.Fatalf("stats do not show the outage: %+v", s.Levels[2])
	}
	srv.Restart()
	deadline = time.Now().Add(10 * time.Second)
	for bottom.Available() != nil {
		if time.Now().After(deadline) {
			t.Fatal("s3 never came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, kind, err := h.Get(key(1), nil); err != nil || kind != index.TierS3 {
		t.Fatalf("s3 block after the store came back: %v %v", kind, err)
	}
}

func TestLocateNamesTheObjectRangeOfBlocksInTheStore(t *testing.T) {
	srv := s3test.Start(t)
	h, bottom := threeLevels(t, srv, 1)
	stored := put(t, h, 1)
	put(t, h, 2)
	for _, kind := range []index.TierKind{index.TierDRAM, index.TierSSD} {
		if err := h.Demote(kind, key(1)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if ps, err := h.Locate(ctx, []index.Key{key(1)}); err != nil || ps[0].Kind != index.TierS3 || ps[0].InObject {
		t.Fatalf("a block not uploaded yet: %v %v; want s3 without an object range", ps, err)
	}
	if err := bottom.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	ps, err := h.Locate(ctx, []index.Key{key(1), key(2), key(3)})
	if err != nil {
		t.Fatal(err)
	}
	if p := ps[0]; p.Kind != index.TierS3 || !p.InObject || p.Object.Bucket != "shared" || p.Meta.Size != blockSize {
		t.Fatalf("uploaded block: %v", p)
	}
	if p := ps[1]; p.Kind != index.TierDRAM || p.InObject {
		t.Fatalf("a block in dram: %v; want dram without an object range", p)
	}
	if p := ps[2]; p.Kind != 0 || p.InObject {
		t.Fatalf("a block held nowhere: %v", p)
	}
	// The range holds the block's bytes, for any reader with credentials.
	r := ps[0].Object
	var opts minio.GetObjectOptions
	if err := opts.SetRange(r.Offset, r.Offset+int64(r.Meta.Size)-1); err != nil {
		t.Fatal(err)
	}
	obj, err := srv.Client().GetObject(ctx, r.Bucket, r.Object, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(obj); err != nil || !bytes.Equal(got, stored) || index.Checksum(got) != r.Meta.Sum {
		t.Fatalf("the object range does not hold the block's bytes (%v)", err)
	}
	// Another node sharing the bucket finds it too.
	other, _ := threeLevels(t, srv, 2)
	if ps, err := other.Locate(ctx, []index.Key{key(1)}); err != nil || !ps[0].InObject || ps[0].Object != r {
		t.Fatalf("locate on another node: %v %v; want %v", ps, err, r)
	}
}

func TestFindSeesBlocksAnotherNodeWroteToTheSharedStore(t *testing.T) {
	srv := s3test.Start(t)
	h1, bottom := threeLevels(t, srv, 1)
	put(t, h1, 1)
	for _, kind := range []index.TierKind{index.TierDRAM, index.TierSSD} {
		if err := h1.Demote(kind, key(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	h2, _ := threeLevels(t, srv, 2) // opened before node 1 writes more
	put(t, h1, 2)
	if err := h1.Demote(index.TierDRAM, key(2)); err != nil {
		t.Fatal(err)
	}
	if err := h1.Demote(index.TierSSD, key(2)); err != nil {
		t.Fatal(err)
	}
	if err := bottom.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h2.Stat(key(2)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat on node 2 of a block it never saw: %v (Stat does not look in the store)", err)
	}
	if _, kind, err := h2.Find(key(2)); err != nil || kind != index.TierS3 {
		t.Fatalf("Find on node 2 of node 1's block in the shared store: %v %v", kind, err)
	}
	if _, kind, err := h2.Stat(key(2)); err != nil || kind != index.TierS3 {
		t.Fatalf("Stat after Find recorded the copy: %v %v", kind, err)
	}
	if _, _, err := h2.Find(key(3)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Find of a block nobody wrote: %v", err)
	}
}

func TestObjectStoreHitsArePromotedIntoTheLevelsConfigured(t *testing.T) {
	srv := s3test.Start(t)
	for _, c := range []struct {
		into []index.TierKind
		want string // the tiers holding the block after a hit in the store
	}{
		{nil, "dram s3"},
		{[]index.TierKind{index.TierSSD}, "ssd s3"},
		{[]index.TierKind{index.TierDRAM, index.TierSSD}, "dram ssd s3"},
	} {
		h, bottom := threeLevelsPromotingInto(t, srv, 1, c.into...)
		put(t, h, 1)
		for _, kind := range []index.TierKind{index.TierDRAM, index.TierSSD} {
			if err := h.Demote(kind, key(1)); err != nil {
				t.Fatal(err)
			}
		}
		if err := bottom.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, _, kind, err := h.Get(key(1), nil); err != nil || kind != index.TierS3 {
			t.Fatalf("into %v: get from the store: %v %v", c.into, kind, err)
		}
		var held []string
		for _, b := range h.Blocks(func(b tiers.BlockInfo) bool { return b.Key == key(1) }) {
			for _, k := range b.Kinds {
				held = append(held, k.String())
			}
		}
		if got := strings.Join(held, " "); got != c.want {
			t.Errorf("promote into %v: the block is in %q after a hit in the store, want %q", c.into, got, c.want)
		}
		h.Close()
	}
}

func TestPromotingIntoASlowerLevelIsRefused(t *testing.T) {
	_, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 2), PromoteInto: []index.TierKind{index.TierSSD}},
		{Kind: index.TierSSD, Tier: newDRAM(t, 2)},
	}})
	if !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "promotes into ssd, which is not a faster level") {
		t.Fatalf("a level promoting into a slower one: %v", err)
	}
}

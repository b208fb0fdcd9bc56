package node

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// newNode returns a node over a DRAM tier of 1 MiB and a second arena
// labelled SSD of 4 MiB, with a 64 KiB block limit.
func newNode(t *testing.T) *Node {
	t.Helper()
	var levels []tiers.LevelConfig
	for _, l := range []struct {
		kind index.TierKind
		size int64
	}{{index.TierDRAM, 1 << 20}, {index.TierSSD, 4 << 20}} {
		tr, err := dram.New(dram.Config{Capacity: l.size, MaxBlockSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		levels = append(levels, tiers.LevelConfig{Kind: l.kind, Tier: tr, HighWatermark: 1, LowWatermark: 1})
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: levels})
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(h, Config{MaxBlockSize: 64 << 10, MaxBatchBlocks: 8, MaxBatchBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func block(ns index.NamespaceID, h index.Hash, size int) (index.Header, []byte) {
	m, b := tiertest.Block(h, size)
	m.Key.NS = ns
	return m, b
}

func TestPutChecksTheChecksum(t *testing.T) {
	n := newNode(t)
	m, b := block(1, 1, 1000)
	m.Sum++
	if err := n.Put(m, b); !errors.Is(err, ErrChecksum) {
		t.Fatalf("put with a wrong checksum: %v", err)
	}
	if ex, _ := n.Exists([]index.Key{m.Key}); ex[0] {
		t.Fatal("block with a wrong checksum was stored")
	}
}

func TestLimitsRefuseWholeBatchesWithTheReason(t *testing.T) {
	n := newNode(t)
	var metas []index.Header
	for i := range 4 {
		m, _ := block(1, index.Hash(i), 1000)
		metas = append(metas, m)
	}
	metas[3].Size = 5 << 20
	err := n.CheckBatch(metas)
	if !errors.Is(err, ErrLimit) || err.Error() != "block 3 is 5.0 MiB, over the 64.0 KiB limit" {
		t.Fatalf("got %v", err)
	}
	metas = make([]index.Header, 9)
	if err := n.CheckBatch(metas); err == nil || !strings.Contains(err.Error(), "batch of 9 blocks, over the 8-block limit") {
		t.Fatalf("got %v", err)
	}
	metas = make([]index.Header, 5)
	for i := range metas {
		metas[i].Size = 64 << 10
	}
	if err := n.CheckBatch(metas); err == nil || !strings.Contains(err.Error(), "batch of 320.0 KiB, over the 256.0 KiB limit") {
		t.Fatalf("got %v", err)
	}
}

func TestEvictBySelector(t *testing.T) {
	n := newNode(t)
	put := func(ns index.NamespaceID, h index.Hash) index.Key {
		m, b := block(ns, h, 10<<10)
		if err := n.Put(m, b); err != nil {
			t.Fatal(err)
		}
		return m.Key
	}
	a1, a2, b1 := put(1, 1), put(1, 2), put(2, 1)
	if _, err := n.Evict(Selector{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("empty selector: %v", err)
	}
	ns := index.NamespaceID(1)
	res, err := n.Evict(Selector{Namespace: &ns, DryRun: true})
	if err != nil || res.Blocks != 2 || res.Bytes != 20<<10 {
		t.Fatalf("dry run: %+v %v", res, err)
	}
	if ex, _ := n.Exists([]index.Key{a1, a2}); !ex[0] || !ex[1] {
		t.Fatal("dry run removed blocks")
	}
	res, err = n.Evict(Selector{Keys: []index.Key{a2, b1}})
	if err != nil || res.Blocks != 2 {
		t.Fatalf("by keys: %+v %v", res, err)
	}
	if ex, _ := n.Exists([]index.Key{a1, a2, b1}); !ex[0] || ex[1] || ex[2] {
		t.Fatalf("after evicting by keys: %v", ex)
	}
	if _, err := n.Evict(Selector{Tier: index.TierS3}); err == nil || !strings.Contains(err.Error(), "no s3 tier") {
		t.Fatalf("unknown tier: %v", err)
	}
}

func TestEvictBytesTakesLeastRecentlyUsedFirst(t *testing.T) {
	n := newNode(t)
	var keys []index.Key
	for i := range 4 {
		m, b := block(1, index.Hash(i), 10<<10)
		if err := n.Put(m, b); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, m.Key)
		time.Sleep(2 * time.Millisecond)
	}
	_, _, _, _ = n.Get(keys[0], nil) // block 0 is now the most recent
	res, err := n.Evict(Selector{Bytes: 15 << 10})
	if err != nil || res.Blocks != 2 || res.Removed[0].Meta.Key != keys[1] || res.Removed[1].Meta.Key != keys[2] {
		t.Fatalf("got %+v %v", res, err)
	}
}

func TestEvictOlderThanAndFromOneTier(t *testing.T) {
	n := newNode(t)
	m, b := block(1, 1, 10<<10)
	_ = n.Put(m, b)
	if res, _ := n.Evict(Selector{OlderThan: time.Hour}); res.Blocks != 0 {
		t.Fatal("fresh block evicted as older than an hour")
	}
	time.Sleep(5 * time.Millisecond)
	res, err := n.Evict(Selector{OlderThan: time.Millisecond, Tier: index.TierDRAM})
	if err != nil || res.Blocks != 1 || res.Removed[0].Tier != index.TierDRAM {
		t.Fatalf("got %+v %v", res, err)
	}
}

func TestPinnedBlocksSurviveEviction(t *testing.T) {
	n := newNode(t)
	m, b := block(1, 1, 1000)
	_ = n.Put(m, b)
	id, exp, err := n.Pin([]index.Key{m.Key}, time.Minute)
	if err != nil || time.Until(exp) < 50*time.Second {
		t.Fatalf("Pin: %v %v", exp, err)
	}
	res, err := n.Evict(Selector{All: true})
	if err != nil || res.Blocks != 0 || res.Pinned != 1 {
		t.Fatalf("evicting everything with one pin: %+v %v", res, err)
	}
	if err := n.Release(id); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(id); !errors.Is(err, ErrUnknownLease) {
		t.Fatalf("second release: %v", err)
	}
	if _, _, err := n.Pin([]index.Key{m.Key}, time.Hour); !errors.Is(err, ErrLimit) {
		t.Fatalf("lease over the cap: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	c := Config{MaxBlockSize: 3 << 30, MaxBatchBlocks: -2, MaxBatchBytes: 10, MaxLease: -time.Second}
	c.EnsureDefaults()
	err := c.Validate()
	for _, want := range []string{"MaxBlockSize 3221225472", "MaxBatchBlocks -2 is not positive", "MaxBatchBytes 10", "MaxLease -1s is not positive"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %q", err, want)
		}
	}
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Errorf("%v is not a tiers.ErrInvalidConfig", err)
	}
	var d Config
	d.EnsureDefaults()
	if err := d.Validate(); err != nil || d.MaxBlockSize != DefaultMaxBlockSize || d.MaxLease != DefaultMaxLease {
		t.Errorf("the defaults: %+v, %v", d, err)
	}
}

func TestLocateSaysWhereBlocksAreWithoutAnObjectStore(t *testing.T) {
	n := newNode(t)
	m, b := tiertest.Block(1, 4<<10)
	if err := n.Put(m, b); err != nil {
		t.Fatal(err)
	}
	ps, err := n.Locate(context.Background(), []index.Key{m.Key, {NS: 1, Hash: 99}})
	if err != nil || ps[0].Kind != index.TierDRAM || ps[0].InObject || ps[0].Meta != m || ps[1].Kind != 0 {
		t.Fatalf("locate: %v %v; want dram (no object range), then nowhere", ps, err)
	}
	if _, err := n.Locate(context.Background(), make([]index.Key, 9)); !errors.Is(err, ErrLimit) {
		t.Fatalf("locate of 9 keys with a batch limit of 8: %v", err)
	}
}

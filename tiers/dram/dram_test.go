package dram

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

func open(t *testing.T, cfg Config) *Tier {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// factory opens DRAM tiers for the conformance suite and the shared
// benchmark.
var factory = tiertest.Factory{
	New: func(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
		tr, err := New(Config{Capacity: capacity, MaxBlockSize: maxBlock})
		if err != nil {
			tb.Fatal(err)
		}
		return tr
	},
	Overhead: DefaultPageSize - 1,
	// Memory is trusted: Get hands out the bytes with the Meta they were
	// put with, and whoever checks the Sum next finds the damage.
	Unchecked: true,
	Corrupt: func(tb testing.TB, tr tiers.Tier, key index.Key) {
		t := tr.(*Tier)
		t.mu.Lock()
		defer t.mu.Unlock()
		b := t.blocks[key]
		if b == nil {
			tb.Fatalf("corrupt: %v is not in the tier", key)
		}
		t.bytes(b)[b.meta.Size/2] ^= 0xff // a flipped byte in the arena
	},
}

func TestConformance(t *testing.T) { tiertest.Run(t, factory) }

func TestUsedCountsWholePages(t *testing.T) {
	tr := open(t, Config{Capacity: 1 << 20, PageSize: 4096})
	m, b := tiertest.Block(1, 5000) // two pages
	if err := tr.Put(m, b); err != nil {
		t.Fatal(err)
	}
	if s := tr.Stats(); s.Used != 8192 || s.Capacity != 1<<20 {
		t.Fatalf("stats %+v, want Used 8192 of 1048576", s)
	}
}

func TestBlockBytesLiveOutsideTheGoHeap(t *testing.T) {
	const blocks, size = 256, 1 << 20
	tr := open(t, Config{Capacity: blocks * size})
	_, value := tiertest.Block(1, size)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range blocks {
		m := index.Header{Key: index.Key{NS: 1, Hash: index.Hash(i)}, Sum: index.Checksum(value)}
		m.Size = size
		if err := tr.Put(m, value); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
		t.Fatalf("256 MiB of blocks grew the Go heap by %d bytes", grew)
	}
	if s := tr.Stats(); s.Used != blocks*size {
		t.Fatalf("Used = %d, want %d", s.Used, blocks*size)
	}
}

func TestViewIsZeroCopyAndPinsPages(t *testing.T) {
	tr := open(t, Config{Capacity: 64 << 10, MaxBlockSize: 32 << 10})
	m, b := tiertest.Block(1, 32<<10)
	if err := tr.Put(m, b); err != nil {
		t.Fatal(err)
	}
	v, err := tr.View(m.Key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v.Bytes(), b) || v.Meta() != m {
		t.Fatal("view shows other bytes")
	}
	v2, _ := tr.View(m.Key, time.Minute)
	if &v.Bytes()[0] != &v2.Bytes()[0] {
		t.Fatal("two views of one block point at different memory: not zero-copy")
	}
	// Deleting the block takes it out of the tier at once ...
	if err := tr.Delete(m.Key); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	// ... but its pages stay pinned: two more blocks of this size do not fit.
	m2, b2 := tiertest.Block(2, 32<<10)
	if err := tr.Put(m2, b2); err != nil {
		t.Fatal(err)
	}
	m3, b3 := tiertest.Block(3, 32<<10)
	if err := tr.Put(m3, b3); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("put into pinned pages: %v, want ErrFull", err)
	}
	if !bytes.Equal(v.Bytes(), b) {
		t.Fatal("pinned bytes were overwritten")
	}
	for _, v := range []tiers.View{v, v2} {
		if err := v.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Put(m3, b3); err != nil {
		t.Fatalf("put after the views were released: %v", err)
	}
}

func TestExpiredViewLeaseFreesPages(t *testing.T) {
	tr := open(t, Config{Capacity: 32 << 10, MaxBlockSize: 32 << 10})
	m, b := tiertest.Block(1, 32<<10)
	if err := tr.Put(m, b); err != nil {
		t.Fatal(err)
	}
	v, err := tr.View(m.Key, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Delete(m.Key); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	m2, b2 := tiertest.Block(2, 32<<10)
	if err := tr.Put(m2, b2); err != nil {
		t.Fatalf("an expired lease still pins the pages: %v", err)
	}
	if err := v.Release(); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Release after the pages were reused: %v, want ErrLeaseExpired", err)
	}
	if s := tr.Stats(); s.Used != 32<<10 || s.Blocks != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestReserveFillsInPlace(t *testing.T) {
	tr := open(t, Config{Capacity: 1 << 20})
	m, b := tiertest.Block(1, 10000)
	r, err := tr.Reserve(m)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), b)
	if _, err := tr.Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatal("reserved block visible before Commit")
	}
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("second Commit: %v", err)
	}
	got, _, err := tr.Get(m.Key, nil)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("Get after Commit: %v", err)
	}
	r2, _ := tr.Reserve(m)
	r2.Abort()
	if s := tr.Stats(); s.Used != 12288 || s.Blocks != 1 {
		t.Fatalf("Abort leaked pages: %+v", s)
	}
}

func TestCloseWaitsForViews(t *testing.T) {
	tr, err := New(Config{Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m, b := tiertest.Block(1, 1000)
	_ = tr.Put(m, b)
	v, _ := tr.View(m.Key, time.Minute)
	_ = tr.Close()
	if !bytes.Equal(v.Bytes(), b) { // would fault if the arena were unmapped
		t.Fatal("view bytes changed after Close")
	}
	_ = v.Release()
	if !tr.unmapped {
		t.Fatal("arena still mapped after the last view was released")
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	cfg := Config{Capacity: -1, PageSize: 1000, MaxBlockSize: -5}
	cfg.EnsureDefaults()
	err := cfg.Validate()
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Validate: %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Capacity is -1", "PageSize is 1000", "MaxBlockSize is -5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if _, err := New(cfg); !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
	cfg = Config{Capacity: 1 << 20, MaxBlockSize: 2 << 20}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "over Capacity") {
		t.Errorf("MaxBlockSize over Capacity: %v", err)
	}
	cfg = Config{Capacity: 1 << 42, PageSize: 512}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "raise PageSize") {
		t.Errorf("2^33 pages: %v", err)
	}
	if _, err := New(Config{}); !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "Capacity is 0") {
		t.Errorf("zero capacity: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	for _, c := range []struct {
		in, want Config
	}{
		{Config{Capacity: 1 << 30}, Config{Capacity: 1 << 30, PageSize: DefaultPageSize, MaxBlockSize: DefaultMaxBlockSize}},
		{Config{Capacity: 1 << 20}, Config{Capacity: 1 << 20, PageSize: DefaultPageSize, MaxBlockSize: 1 << 20}},
		{Config{Capacity: 1 << 30, PageSize: 8192, MaxBlockSize: 1 << 16, NoHugePages: true},
			Config{Capacity: 1 << 30, PageSize: 8192, MaxBlockSize: 1 << 16, NoHugePages: true}},
	} {
		got := c.in
		got.EnsureDefaults()
		if got != c.want {
			t.Errorf("EnsureDefaults(%+v) = %+v, want %+v", c.in, got, c.want)
		}
		if err := got.Validate(); err != nil {
			t.Errorf("defaults of %+v: %v", c.in, err)
		}
	}
}

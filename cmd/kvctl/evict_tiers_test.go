package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// The object store is a tier like the others: evict's help names it.
func TestEvictHelpListsEveryTier(t *testing.T) {
	code, out, stderr := run(t, "evict", "--help")
	if code != exitOK {
		t.Fatalf("status %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"--tier dram|ssd|s3", "only the copies in this tier: dram, ssd or s3"} {
		if !strings.Contains(out, want) {
			t.Errorf("evict --help does not say %q:\n%s", want, out)
		}
	}
}

// evict --tier s3 removes the object store's copies and nothing else.
func TestEvictFromTheObjectStoreTier(t *testing.T) {
	cfg := s3test.Start(t).Config("evict")
	cfg.FlushInterval = time.Hour // uploads happen when the test flushes
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := nodetest.Start(t, nodetest.Options{Inline: true, DRAMBytes: 8 << 20, SSDBytes: 8 << 20,
		Below: []tiers.LevelConfig{{Kind: index.TierS3, Tier: store}}})
	keys := putBlocks(t, srv.Addr, 0xcc, 64<<10, 1, 2, 3)
	h := srv.Hierarchy()
	for _, k := range keys[:2] { // down to the object store
		for _, kind := range []index.TierKind{index.TierDRAM, index.TierSSD} {
			if err := h.Demote(kind, k); err != nil {
				t.Fatalf("demote %v from %v: %v", k, kind, err)
			}
		}
	}
	if err := store.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, "--addr", srv.Addr, "evict", "--tier", "s3", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 2 blocks (128.0 KiB).") {
		t.Fatalf("status %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if got := held(t, srv.Node, keys...); got[0] || got[1] || !got[2] {
		t.Errorf("held after evicting the object store's blocks: %v, want only the third", got)
	}
}

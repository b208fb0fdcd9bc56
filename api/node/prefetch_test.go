package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// overS3 returns a node over a DRAM tier and a real object store holding n
// blocks of 64 KiB, all moved down into the store's segments, and their
// bytes.
func overS3(t *testing.T, n int) (*Node, *s3.Tier, []index.Key, [][]byte) {
	t.Helper()
	return overS3Segments(t, n, 0)
}

// overS3Segments is overS3 with the store's segments of segmentSize bytes
// (0: the default).
func overS3Segments(t *testing.T, n int, segmentSize int64) (*Node, *s3.Tier, []index.Key, [][]byte) {
	t.Helper()
	srv := s3test.Start(t)
	cfg := srv.Config("readahead")
	if segmentSize > 0 {
		cfg.SegmentSize = segmentSize
		cfg.FlushInterval = time.Hour // segments sealed by size alone
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	bottom, err := s3.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	top, err := dram.New(dram.Config{Capacity: 4 << 20, MaxBlockSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: top},
		{Kind: index.TierS3, Tier: bottom, Shared: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	nd, err := New(h, Config{MaxBlockSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Close() })
	keys := make([]index.Key, n)
	want := make([][]byte, n)
	for i := range n {
		m, b := block(1, index.Hash(i+1), 64<<10)
		if err := nd.Put(m, b); err != nil {
			t.Fatal(err)
		}
		keys[i], want[i] = m.Key, b
	}
	demote(t, nd, keys)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bottom.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return nd, bottom, keys, want
}

// demote moves keys out of DRAM into the object store below, those DRAM
// holds.
func demote(t *testing.T, nd *Node, keys []index.Key) {
	t.Helper()
	for _, k := range keys {
		if err := nd.Hierarchy().Demote(index.TierDRAM, k); err != nil && !errors.Is(err, tiers.ErrNotFound) {
			t.Fatal(err)
		}
	}
}

// TestReadAheadLetsGoOfBlocksOnlyOnceSentOrAbandoned opens the first blocks
// of a restore from the object store, ends the Get early, and checks that
// the opened blocks keep their bytes until released — their pooled
// buffers are poisoned on the last release in tests — and that every
// buffer of the Get, those of blocks never opened too, went back to the
// pool: a second restore of the same blocks reuses each.
func TestReadAheadLetsGoOfBlocksOnlyOnceSentOrAbandoned(t *testing.T) {
	nd, bottom, keys, want := overS3(t, 8)
	ra := nd.ReadAhead(keys)
	var releases []func()
	var got [][]byte
	for _, k := range keys[:3] {
		m, b, release, _, err := ra.Next(k)
		if err != nil || m.Key != k {
			t.Fatalf("Next(%v): %v %v", k, m.Key, err)
		}
		got = append(got, b)
		releases = append(releases, release)
	}
	waitForReads(t, bottom, 6) // the read ahead has started every chunk: 1, 2, 4 and 1 blocks (the single ones unpooled)
	ra.Close()                 // blocks 3 to 7 are never sent
	waitForChunks(t, ra)
	for i, b := range got {
		if !bytes.Equal(b, want[i]) {
			t.Fatalf("block %d changed before its release, after the Get ended", i)
		}
		releases[i]()
	}
	first := bottom.S3Stats()

	demote(t, nd, keys) // the first restore promoted them into DRAM
	restoreAll(t, "second restore", nd, keys, want)
	if s := bottom.S3Stats(); s.ReusedBuffers-first.ReusedBuffers != first.ReadBuffers {
		t.Fatalf("the second restore reused %d of the first one's %d buffers; the rest were never let go",
			s.ReusedBuffers-first.ReusedBuffers, first.ReadBuffers)
	}
}

// waitForReads waits until the tier has read n pooled buffers.
func waitForReads(t *testing.T, tr *s3.Tier, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tr.S3Stats().ReadBuffers < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the read ahead read %d buffers, want %d", tr.S3Stats().ReadBuffers, n)
		}
	}
}

// waitForChunks waits until the reads ahead in flight when a Get ended,
// cancelled, are over.
func waitForChunks(t *testing.T, ra *ReadAhead) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ra.mu.Lock()
		n := ra.chunks
		ra.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads ahead still in flight after the Get ended", n)
		}
	}
}

// TestReadAheadChunksFollowObjects restores a chain stored in segment
// objects of five blocks each and counts the store's ranged GETs: after
// the first, small chunks (1, 2, 4 and 8 blocks, each cut where an object
// ends), each chunk reads the rest of one object, so that one ranged GET
// reads each whole segment and none is split between two chunks.
func TestReadAheadChunksFollowObjects(t *testing.T) {
	const n = 40
	nd, bottom, keys, want := overS3Segments(t, n, 5*64<<10)
	objects := make([]string, n)
	for i, k := range keys {
		r, err := bottom.LocateObject(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		objects[i] = r.Object
	}
	if objects[0] == objects[n-1] {
		t.Fatal("the chain lies in one segment object; the test needs several")
	}
	wantGets := 0 // one a chunk: 1, 2, 4, 8 blocks, cut at objects' ends, then the rest of each object
	for i, size := 0, 1; i < n; wantGets++ {
		first := i
		for i++; i < n && objects[i] == objects[first] && (size >= 16 || i-first < size); i++ {
		}
		size = min(16, 2*size)
	}

	before := bottom.S3Stats().RangedGets
	restoreAll(t, "restore", nd, keys, want)
	if got := bottom.S3Stats().RangedGets - before; got != int64(wantGets) {
		t.Fatalf("the restore of %d blocks in segments of 5 sent %d ranged GETs, want %d (objects %v)", n, got, wantGets, objects)
	}
}

// restoreAll reads keys through a read ahead of nd, in order, and checks
// each block against want.
func restoreAll(t *testing.T, what string, nd *Node, keys []index.Key, want [][]byte) {
	t.Helper()
	ra := nd.ReadAhead(keys)
	defer ra.Close()
	for i, k := range keys {
		_, b, release, _, err := ra.Next(k)
		if err != nil || !bytes.Equal(b, want[i]) {
			t.Fatalf("%s, block %d: %v, or wrong bytes", what, i, err)
		}
		release()
	}
}

package s3_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// indexSizes returns the size of every index object in bucket.
func indexSizes(t *testing.T, srv *s3test.Server, bucket string) []int64 {
	t.Helper()
	var sizes []int64
	for o := range srv.Client().ListObjectsIter(context.Background(), bucket,
		minio.ListObjectsOptions{Prefix: "v1/idx/", Recursive: true}) {
		must(t, o.Err)
		sizes = append(sizes, o.Size)
	}
	return sizes
}

// storedSegment puts n blocks of size bytes into one segment of a fresh
// tier on bucket and uploads it.
func storedSegment(t *testing.T, srv *s3test.Server, bucket string, n, size int) (*s3.Tier, s3.Config) {
	t.Helper()
	cfg := srv.Config(bucket)
	cfg.DeleteDelay = time.Hour // only Flush applies deletes
	tr := openTier(t, cfg)
	for i := range n {
		must(t, tr.Put(block(1, index.Hash(i+1), size)))
	}
	flush(t, tr)
	return tr, cfg
}

func TestDeleteRewritesTheIndexWithoutTheBlock(t *testing.T) {
	srv := s3test.Start(t)
	tr, cfg := storedSegment(t, srv, "rewrite", 4, 1000)
	before := indexSizes(t, srv, "rewrite")

	must(t, tr.Delete(index.Key{NS: 1, Hash: 2}))
	if _, _, err := tr.Get(index.Key{NS: 1, Hash: 2}, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of a deleted block: %v, want ErrNotFound", err)
	}
	if s := tr.S3Stats(); s.PendingDeletes != 1 {
		t.Fatalf("PendingDeletes = %d before Flush, want 1", s.PendingDeletes)
	}
	if got := indexSizes(t, srv, "rewrite"); len(got) != 1 || got[0] != before[0] {
		t.Fatalf("index rewritten before DeleteDelay or Flush: %v → %v", before, got)
	}
	flush(t, tr)
	after := indexSizes(t, srv, "rewrite")
	if len(after) != 1 || after[0] != before[0]-48 {
		t.Fatalf("index object sizes %v after deleting one of 4 blocks, want [%d]", after, before[0]-48)
	}
	if s := tr.S3Stats(); s.PendingDeletes != 0 || s.IndexRewrites != 1 || s.Segments != 1 {
		t.Fatalf("S3Stats after Flush: %+v", s)
	}

	// Another node opening the bucket now sees 3 blocks.
	other := openTier(t, cfg)
	if s := other.Stats(); s.Blocks != 3 {
		t.Fatalf("a fresh tier sees %d blocks, want 3", s.Blocks)
	}
	if _, err := other.Stat(index.Key{NS: 1, Hash: 2}); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("a fresh tier finds the deleted block: %v", err)
	}
}

func TestDeletingEveryBlockDeletesTheSegment(t *testing.T) {
	srv := s3test.Start(t)
	tr, _ := storedSegment(t, srv, "empty", 3, 1000)
	for i := range 3 {
		must(t, tr.Delete(index.Key{NS: 1, Hash: index.Hash(i + 1)}))
	}
	flush(t, tr)
	if names := objects(t, srv, "empty", ""); len(names) != 0 {
		t.Fatalf("objects left after every block of the segment was deleted: %v", names)
	}
	if s := tr.S3Stats(); s.Segments != 0 || s.SegmentDeletes != 1 || s.StoredBytes != 0 {
		t.Fatalf("S3Stats after the segment went: %+v", s)
	}
}

func TestDeleteDelayBatchesDeletes(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("batch")
	cfg.DeleteDelay = 100 * time.Millisecond
	tr := openTier(t, cfg)
	for i := range 10 {
		must(t, tr.Put(block(1, index.Hash(i+1), 1000)))
	}
	flush(t, tr)
	for i := range 5 {
		must(t, tr.Delete(index.Key{NS: 1, Hash: index.Hash(i + 1)}))
	}
	deadline := time.Now().Add(3 * time.Second)
	for tr.S3Stats().PendingDeletes != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("deletes not applied 3s after a DeleteDelay of 100ms: %+v", tr.S3Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if s := tr.S3Stats(); s.IndexRewrites != 1 {
		t.Fatalf("5 deletes in one burst cost %d index rewrites, want 1", s.IndexRewrites)
	}
}

func TestReplacingAStoredBlockRemovesTheOldCopy(t *testing.T) {
	srv := s3test.Start(t)
	tr, cfg := storedSegment(t, srv, "replace", 2, 1000)
	m, v := block(1, 1, 2000) // same key, new bytes
	must(t, tr.Put(m, v))
	flush(t, tr)
	if got := indexSizes(t, srv, "replace"); len(got) != 2 || got[0]+got[1] != 40+8+48+40+8+48 {
		t.Fatalf("index sizes %v: want two one-block indexes after the old copy went", got)
	}
	other := openTier(t, cfg)
	_, gm, err := other.Get(m.Key, nil)
	must(t, err)
	if gm != m {
		t.Fatalf("a fresh tier reads the old copy: %+v, want %+v", gm, m)
	}
	if s := other.Stats(); s.Blocks != 2 {
		t.Fatalf("a fresh tier sees %d blocks, want 2", s.Blocks)
	}
}

func TestDeletedButNotRewrittenBlockComesBackIntact(t *testing.T) {
	srv := s3test.Start(t)
	tr, cfg := storedSegment(t, srv, "crash", 3, 1000)
	must(t, tr.Delete(index.Key{NS: 1, Hash: 1}))
	// A second tier on the bucket plays the node after a crash: the
	// delete never reached the index, so the block is back, intact.
	again := openTier(t, cfg)
	m, want := block(1, 1, 1000)
	got, gm, err := again.Get(m.Key, nil)
	must(t, err)
	if gm != m || string(got) != string(want) {
		t.Fatal("a block whose delete was lost came back different")
	}
}

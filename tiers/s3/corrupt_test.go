package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// tamper rewrites object name of bucket through a plain minio-go client,
// changing its bytes with edit.
func tamper(t testing.TB, srv *s3test.Server, bucket, name string, edit func([]byte) []byte) {
	t.Helper()
	c := srv.Client()
	ctx := context.Background()
	obj, err := c.GetObject(ctx, bucket, name, minio.GetObjectOptions{})
	must(t, err)
	b, err := io.ReadAll(obj)
	must(t, err)
	b = edit(b)
	_, err = c.PutObject(ctx, bucket, name, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
	must(t, err)
}

// The conformance suite checks that a block with a flipped byte in its
// segment object reads as tiers.ErrCorrupt, then as missing, next to
// intact neighbours (tiertest.Factory.Corrupt). The tests here check what
// only an object store does: the count of corrupt blocks, the index object
// rewritten without the block, damaged index objects and segments cut
// short or gone.

func TestCorruptBlockIsCountedAndLeavesTheIndex(t *testing.T) {
	srv := s3test.Start(t)
	tr, cfg := storedSegment(t, srv, "corrupt", 3, 1000)
	data := objects(t, srv, "corrupt", "v1/seg/")
	if len(data) != 1 {
		t.Fatalf("data objects %v, want 1", data)
	}
	// Flip a byte of the second block (bytes 1000–1999).
	tamper(t, srv, "corrupt", data[0], func(b []byte) []byte { b[1500] ^= 0xff; return b })

	key := index.Key{NS: 1, Hash: 2}
	got, _, err := tr.Get(key, []byte("dst"))
	if !errors.Is(err, tiers.ErrCorrupt) || got != nil {
		t.Fatalf("Get of a block with a flipped byte: %d bytes, %v; want nil and ErrCorrupt", len(got), err)
	}
	if s := tr.S3Stats(); s.CorruptBlocks != 1 {
		t.Fatalf("CorruptBlocks = %d, want 1", s.CorruptBlocks)
	}

	// The block is gone from the index too: other nodes never see it.
	flush(t, tr)
	if _, err := openTier(t, cfg).Stat(key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("a fresh tier still finds the corrupt block: %v", err)
	}
}

func TestTruncatedSegmentIsCorrupt(t *testing.T) {
	srv := s3test.Start(t)
	tr, _ := storedSegment(t, srv, "truncated", 3, 1000)
	data := objects(t, srv, "truncated", "v1/seg/")
	tamper(t, srv, "truncated", data[0], func(b []byte) []byte { return b[:2500] })
	if _, _, err := tr.Get(index.Key{NS: 1, Hash: 3}, nil); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("Get of a block past the end of a truncated segment: %v, want ErrCorrupt", err)
	}
	if _, _, err := tr.Get(index.Key{NS: 1, Hash: 1}, nil); err != nil {
		t.Fatalf("Get of a block the truncated segment still holds: %v", err)
	}
}

func TestCorruptIndexIsIgnored(t *testing.T) {
	srv := s3test.Start(t)
	_, cfg := storedSegment(t, srv, "badindex", 3, 1000)
	idx := objects(t, srv, "badindex", "v1/idx/")
	tamper(t, srv, "badindex", idx[0], func(b []byte) []byte { b[50] ^= 1; return b })
	tr := openTier(t, cfg)
	if s := tr.S3Stats(); s.CorruptIndexes != 1 || tr.Stats().Blocks != 0 {
		t.Fatalf("Open over a damaged index: %d corrupt indexes, %d blocks; want 1 and 0",
			s.CorruptIndexes, tr.Stats().Blocks)
	}
}

func TestWrongChecksumFromTheCallerIsCorrupt(t *testing.T) {
	srv := s3test.Start(t)
	tr := openTier(t, srv.Config("wrongsum"))
	m, b := block(1, 1, 1000)
	m.Sum++
	must(t, tr.Put(m, b))
	if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("Get of a block put with a wrong sum: %v, want ErrCorrupt", err)
	}
}

func TestSegmentWhoseDataIsGoneIsForgotten(t *testing.T) {
	srv := s3test.Start(t)
	tr, cfg := storedSegment(t, srv, "expired", 3, 1000)
	// A lifecycle rule expires the data object before its index.
	data := objects(t, srv, "expired", "v1/seg/")
	must(t, srv.Client().RemoveObject(context.Background(), "expired", data[0], minio.RemoveObjectOptions{}))

	if _, _, err := tr.Get(index.Key{NS: 1, Hash: 2}, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of a block whose data object is gone: %v, want ErrNotFound", err)
	}
	if s := tr.Stats(); s.Blocks != 0 {
		t.Fatalf("the tier still counts %d blocks of the gone segment", s.Blocks)
	}
	if names := objects(t, srv, "expired", ""); len(names) != 0 {
		t.Fatalf("the index of the gone segment is still there: %v", names)
	}
	if s := openTier(t, cfg).Stats(); s.Blocks != 0 {
		t.Fatalf("a fresh tier finds %d blocks of the gone segment", s.Blocks)
	}
}

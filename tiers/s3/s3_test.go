package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// testLogger sends warnings and errors to t.Log, so that a passing test is
// quiet and a failing one shows what the tier said.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// openTier opens a tier on cfg, with a test logger, and closes it when the
// test ends.
func openTier(t testing.TB, cfg s3.Config) *s3.Tier {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := s3.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func flush(t testing.TB, tr *s3.Tier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t, tr.Flush(ctx))
}

// block is tiertest.Block in namespace ns.
func block(ns index.NamespaceID, h index.Hash, n int) (index.Header, []byte) {
	m, b := tiertest.Block(h, n)
	m.Key.NS = ns
	return m, b
}

// objects lists the names of the objects under prefix in bucket.
func objects(t testing.TB, srv *s3test.Server, bucket, prefix string) []string {
	t.Helper()
	var names []string
	for o := range srv.Client().ListObjectsIter(context.Background(), bucket,
		minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		must(t, o.Err)
		names = append(names, o.Key)
	}
	return names
}

// countUnder counts names that start with prefix.
func countUnder(names []string, prefix string) int {
	n := 0
	for _, name := range names {
		if strings.HasPrefix(name, prefix) {
			n++
		}
	}
	return n
}

func TestConformance(t *testing.T) { tiertest.Run(t, factory(s3test.Start(t), "conformance")) }

// factory opens tiers in bucket of srv, each under a prefix of its own,
// for the conformance suite and the shared benchmark.
func factory(srv *s3test.Server, bucket string) tiertest.Factory {
	var n atomic.Int64
	var mu sync.Mutex
	configs := map[tiers.Tier]s3.Config{}
	return tiertest.Factory{
		New: func(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
			cfg := srv.Config(bucket)
			cfg.Prefix = fmt.Sprintf("t%d", n.Add(1))
			cfg.Capacity, cfg.MaxBlockSize = capacity, maxBlock
			tr := openTier(tb, cfg)
			mu.Lock()
			configs[tr] = cfg
			mu.Unlock()
			return tr
		},
		Reopen: func(tb testing.TB, tr tiers.Tier) tiers.Tier {
			must(tb, tr.Close())
			mu.Lock()
			cfg := configs[tr]
			mu.Unlock()
			return openTier(tb, cfg)
		},
		Overhead: s3.BlockOverhead,
		Flush:    func(tb testing.TB, tr tiers.Tier) { flush(tb, tr.(*s3.Tier)) },
		Corrupt: func(tb testing.TB, tr tiers.Tier, key index.Key) {
			// A flipped byte in the middle of the block, in the segment
			// object the tier reads it from.
			r, err := tr.(*s3.Tier).LocateObject(context.Background(), key)
			must(tb, err)
			tamper(tb, srv, r.Bucket, r.Object, func(b []byte) []byte {
				b[r.Offset+int64(r.Meta.Size)/2] ^= 0xff
				return b
			})
		},
	}
}

func TestManySmallPutsPackIntoFewSegments(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("packing")
	cfg.SegmentSize = 256 << 10
	cfg.FlushInterval = time.Hour // only size and Flush seal
	tr := openTier(t, cfg)

	const blocks, size = 200, 4 << 10 // 64 blocks fill a segment
	for i := range blocks {
		must(t, tr.Put(block(1, index.Hash(i+1), size)))
	}
	m, b := block(2, 1, size) // another namespace: a segment of its own
	must(t, tr.Put(m, b))
	flush(t, tr)

	names := objects(t, srv, "packing", "")
	// 200 blocks of namespace 1 make segments of 64, 64, 64 and 8 blocks;
	// namespace 2 makes one more. Each segment is two objects.
	if data, idx := countUnder(names, "v1/seg/"), countUnder(names, "v1/idx/"); data != 5 || idx != 5 || len(names) != 10 {
		t.Fatalf("%d puts made %d data and %d index objects (%d objects in all), want 5 and 5:\n%s",
			blocks+1, data, idx, len(names), strings.Join(names, "\n"))
	}
	if s := tr.S3Stats(); s.Segments != 5 || s.Objects != 10 || s.PendingBytes != 0 || s.Uploads != 10 {
		t.Fatalf("S3Stats after flush: %+v", s)
	}
	for i := range blocks {
		m, b := block(1, index.Hash(i+1), size)
		got, gm, err := tr.Get(m.Key, nil)
		must(t, err)
		if !bytes.Equal(got, b) || gm != m {
			t.Fatalf("block %d read back differently", i+1)
		}
	}
}

func TestGetReadsOnlyTheBlocksBytes(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("ranged")
	cfg.FlushInterval = time.Hour // the blocks stay in memory until flush, however slow the puts
	tr := openTier(t, cfg)
	const size = 64 << 10
	for i := range 64 {
		must(t, tr.Put(block(1, index.Hash(i+1), size)))
	}

	before := tr.S3Stats()
	m, b := block(1, 7, size)
	got, _, err := tr.Get(m.Key, nil)
	must(t, err)
	if !bytes.Equal(got, b) {
		t.Fatal("block read from memory differs")
	}
	if s := tr.S3Stats(); s.RangedGets != before.RangedGets {
		t.Fatalf("a block still in memory was read from the store (%d ranged GETs)", s.RangedGets-before.RangedGets)
	}

	flush(t, tr)
	before = tr.S3Stats()
	for _, h := range []index.Hash{1, 33, 64} {
		m, b := block(1, h, size)
		got, gm, err := tr.Get(m.Key, []byte("x"))
		must(t, err)
		if !bytes.Equal(got[1:], b) || gm != m {
			t.Fatalf("block %d read back differently", h)
		}
	}
	s := tr.S3Stats()
	if gets, read := s.RangedGets-before.RangedGets, s.RangedGetBytes-before.RangedGetBytes; gets != 3 || read != 3*size {
		t.Fatalf("3 Gets of %d-byte blocks from a %d-byte segment sent %d ranged GETs for %d bytes, want 3 for %d",
			size, 64*size, gets, read, 3*size)
	}
}

func TestFlushIntervalUploadsAPartialSegment(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("interval")
	cfg.FlushInterval = 50 * time.Millisecond
	tr := openTier(t, cfg)
	must(t, tr.Put(block(1, 1, 1000)))
	deadline := time.Now().Add(5 * time.Second)
	for len(objects(t, srv, "interval", "")) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no segment uploaded 5s after a put, with a FlushInterval of 50ms: %+v", tr.S3Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestMultipartSegment(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("multipart")
	cfg.PartSize = s3.MinPartSize
	cfg.SegmentSize = 12 << 20    // three parts
	cfg.FlushInterval = time.Hour // one segment, however slow the puts
	tr := openTier(t, cfg)
	const size = 1 << 20
	for i := range 12 {
		must(t, tr.Put(block(1, index.Hash(i+1), size)))
	}
	flush(t, tr)
	info, err := srv.Client().StatObject(context.Background(), "multipart", objects(t, srv, "multipart", "v1/seg/")[0], minio.StatObjectOptions{})
	must(t, err)
	if info.Size != 12*size || !strings.Contains(info.ETag, "-") {
		t.Fatalf("segment object: %d bytes, ETag %q; want %d bytes from a multipart upload", info.Size, info.ETag, 12*size)
	}
	for _, h := range []index.Hash{1, 6, 12} {
		m, b := block(1, h, size)
		got, _, err := tr.Get(m.Key, nil)
		must(t, err)
		if !bytes.Equal(got, b) {
			t.Fatalf("block %d of a multipart segment read back differently", h)
		}
	}
}

func TestTwoNodesShareABucket(t *testing.T) {
	srv := s3test.Start(t)
	a := openTier(t, srv.Config("shared"))
	cfg := srv.Config("shared")
	cfg.RescanInterval = time.Hour // only misses rescan
	b := openTier(t, cfg)

	var metas []index.Header
	for i := range 10 {
		m, v := block(1, index.Hash(i+1), 10000)
		must(t, a.Put(m, v))
		metas = append(metas, m)
	}
	if _, _, err := b.Get(metas[0].Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get on node b of a block node a has not uploaded yet: %v, want ErrNotFound", err)
	}
	flush(t, a)

	// A miss rescans, at most once per MissRescanInterval (1s).
	var got []byte
	var err error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got, _, err = b.Get(metas[3].Key, nil); err == nil {
			break
		}
	}
	must(t, err)
	if index.Checksum(got) != metas[3].Sum {
		t.Fatal("node b read different bytes")
	}
	n := 0
	must(t, b.Scan(func(index.Header) bool { n++; return true }))
	if s := b.Stats(); n != 10 || s.Blocks != 10 || s.Used != 10*(10000+s3.BlockOverhead) {
		t.Fatalf("node b scans %d blocks, Stats %+v; want node a's 10", n, s)
	}

	// Node a deletes them all: the segment goes, and node b, which still
	// maps them, finds them gone at its next read.
	for _, m := range metas {
		must(t, a.Delete(m.Key))
	}
	flush(t, a)
	if names := objects(t, srv, "shared", ""); len(names) != 0 {
		t.Fatalf("objects left after every block was deleted: %v", names)
	}
	if _, _, err := b.Get(metas[5].Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get on node b of a block node a deleted: %v, want ErrNotFound", err)
	}
	if s := b.Stats(); s.Blocks != 0 {
		t.Fatalf("node b still counts %d blocks of a deleted segment", s.Blocks)
	}
}

func TestPeriodicRescanFindsOtherNodesSegments(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("rescan")
	cfg.RescanInterval = 50 * time.Millisecond
	cfg.MissRescanInterval = -1
	a := openTier(t, cfg)
	b := openTier(t, cfg)
	m, v := block(1, 1, 5000)
	must(t, a.Put(m, v))
	flush(t, a)
	deadline := time.Now().Add(3 * time.Second)
	for {
		if _, err := b.Stat(m.Key); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node b did not learn of node a's segment within 3s of rescans every 50ms")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A rescan reads only indexes it has not seen: node b none again, and
	// node a none at all, since it wrote the only one.
	before := b.S3Stats()
	time.Sleep(200 * time.Millisecond)
	if s := b.S3Stats(); s.Rescans == before.Rescans || s.IndexReads != before.IndexReads {
		t.Fatalf("node b's rescans %d → %d read %d indexes again", before.Rescans, s.Rescans, s.IndexReads-before.IndexReads)
	}
	if s := a.S3Stats(); s.Rescans < 3 || s.IndexReads != 0 {
		t.Fatalf("node a's %d rescans read its own index %d times", s.Rescans, s.IndexReads)
	}
}

func TestOpenReadsOnlyIndexes(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("reopen")
	cfg.SegmentSize = 1 << 20
	cfg.FlushInterval = time.Hour // segments sealed by size alone, however slow the puts
	tr := openTier(t, cfg)
	for i := range 40 {
		must(t, tr.Put(block(1, index.Hash(i+1), 100<<10)))
	}
	must(t, tr.Close())
	tr = openTier(t, cfg)
	s := tr.S3Stats()
	if s.RangedGets != 0 || s.IndexReads != s.Segments || s.Segments != 4 {
		t.Fatalf("Open of 4 segments: %d ranged GETs, %d index reads, %d segments", s.RangedGets, s.IndexReads, s.Segments)
	}
	if st := tr.Stats(); st.Blocks != 40 {
		t.Fatalf("reopened tier has %d blocks, want 40", st.Blocks)
	}
	keys := make([]index.Key, 40)
	for i := range keys {
		keys[i] = index.Key{NS: 1, Hash: index.Hash(i + 1)}
	}
	seen := map[int]bool{}
	must(t, tr.GetMany(context.Background(), keys, func(i int, v []byte, m index.Header, err error) {
		must(t, err)
		if seen[i] || m.Key != keys[i] || index.Checksum(v) != m.Sum {
			t.Errorf("GetMany: key %d: seen %v, meta %+v", i, seen[i], m)
		}
		seen[i] = true
	}))
	if len(seen) != 40 {
		t.Fatalf("GetMany called fn for %d of 40 keys", len(seen))
	}
	// Adjacent blocks of a segment come in one ranged GET each segment:
	// 4 segments of 10 blocks, 4 requests, not 40.
	if got := tr.S3Stats().RangedGets - s.RangedGets; got != 4 {
		t.Fatalf("GetMany of 40 blocks in 4 segments sent %d ranged GETs, want 4", got)
	}
}

// putUploaded puts n blocks of size bytes into tr, keys 1 to n of
// namespace 1, flushes them to the store and returns their keys.
func putUploaded(t *testing.T, tr *s3.Tier, n, size int) []index.Key {
	t.Helper()
	keys := make([]index.Key, n)
	for i := range keys {
		m, b := block(1, index.Hash(i+1), size)
		must(t, tr.Put(m, b))
		keys[i] = m.Key
	}
	flush(t, tr)
	return keys
}

// TestGetManyPooledReusesABufferOnlyOnceEveryHolderReleasedIt reads the
// same stored blocks three times into pooled buffers. While the first
// read's blocks are still held, the second read must not get their
// buffers; once they are released, the third read reuses them. Buffers
// are poisoned on release in tests, so a reuse (or a release) that came
// too soon would show as held blocks failing their checksums.
func TestGetManyPooledReusesABufferOnlyOnceEveryHolderReleasedIt(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("pooled")
	cfg.SegmentSize = 1 << 20
	cfg.FlushInterval = time.Hour // segments sealed by size alone, uploaded by flush
	tr := openTier(t, cfg)
	keys := putUploaded(t, tr, 24, 100<<10)

	type held struct {
		v   []byte
		ref *bufpool.Buffer
		m   index.Header
	}
	read := func() []held {
		out := make([]held, len(keys))
		must(t, tr.GetManyPooled(context.Background(), keys, func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
			must(t, err)
			if ref == nil {
				t.Errorf("block %d of a stored segment came without a pooled buffer", i)
			}
			out[i] = held{v, ref, m}
		}))
		return out
	}
	intact := func(what string, hs []held) {
		t.Helper()
		for i, h := range hs {
			if h.m.Key != keys[i] || index.Checksum(h.v) != h.m.Sum {
				t.Fatalf("%s: block %d no longer holds its bytes", what, i)
			}
		}
	}
	first := read()
	buffers := tr.S3Stats().ReadBuffers // one a block
	second := read()
	intact("first read, held during the second", first)
	intact("second read", second)
	if s := tr.S3Stats(); buffers != int64(len(keys)) || s.ReusedBuffers != 0 || s.ReadBuffers != 2*buffers {
		t.Fatalf("two reads of %d blocks with every block held: %d then %d buffers, %d reused; want %d fresh",
			len(keys), buffers, s.ReadBuffers, s.ReusedBuffers, 2*len(keys))
	}
	for _, h := range first {
		h.ref.Release()
	}
	if !bytes.Equal(first[0].v, bytes.Repeat([]byte{bufpool.Poison}, len(first[0].v))) {
		t.Fatal("a released buffer still holds its block: poisoning is off in this test binary")
	}
	third := read()
	intact("second read, held during the third", second)
	intact("third read", third)
	if s := tr.S3Stats(); s.ReusedBuffers != buffers {
		t.Fatalf("a read after the first one's blocks were released reused %d buffers, want its %d", s.ReusedBuffers, buffers)
	}
	for _, hs := range [][]held{second, third} {
		for _, h := range hs {
			h.ref.Release()
		}
	}
}

// TestRangedReadsShareOneConnection reads blocks whose sizes fall around
// the receive low-water mark's limits (see markedBody), with one request
// in flight, so that every ranged GET reuses the connection of the one
// before: as a segment range, then one by one, twice. A mark left above
// one byte after a body, or one asking for more bytes than a body has
// left, would leave a read waiting until RequestTimeout and fail it.
func TestRangedReadsShareOneConnection(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Config("onecon")
	cfg.Concurrency = 1
	cfg.RequestTimeout = time.Minute
	tr := openTier(t, cfg)
	sizes := []int{1<<20 + 4<<10 - 1, 1<<20 + 4<<10 + 1, 777, 2<<20 + 3, 4 << 10, 3 << 20}
	keys := make([]index.Key, len(sizes))
	want := make([][]byte, len(sizes))
	for i, n := range sizes {
		m, b := block(1, index.Hash(i+1), n)
		must(t, tr.Put(m, b))
		keys[i], want[i] = m.Key, b
	}
	flush(t, tr)
	before := tr.S3Stats().RangedGets
	for round := range 2 {
		got := make([][]byte, len(keys))
		must(t, tr.GetManyPooled(context.Background(), keys, func(i int, v []byte, ref *bufpool.Buffer, _ index.Header, err error) {
			must(t, err)
			got[i] = bytes.Clone(v)
			ref.Release()
		}))
		for i, k := range keys {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("round %d: GetManyPooled of block %d (%d bytes) read wrong", round, i, sizes[i])
			}
			v, _, err := tr.Get(k, nil)
			must(t, err)
			if !bytes.Equal(v, want[i]) {
				t.Fatalf("round %d: Get of block %d (%d bytes) read wrong", round, i, sizes[i])
			}
		}
	}
	if n := tr.S3Stats().RangedGets - before; n < int64(2*(1+len(keys))) {
		t.Fatalf("%d ranged GETs, want at least %d: the blocks were not read from the store", n, 2*(1+len(keys)))
	}
}

// ReadBuffers bounds the read buffers the tier keeps once a restore lets
// them go: a second read of the same 24 blocks (buffers of 104 KiB) reuses
// all of them under the default bound of four 1 MiB segments, and only the
// 9 that fit under a bound of 1 MiB.
func TestReadBuffersBoundsTheBuffersASecondReadReuses(t *testing.T) {
	srv := s3test.Start(t)
	for _, tc := range []struct {
		readBuffers int64
		reused      int64
	}{{0, 24}, {1 << 20, 9}} {
		cfg := srv.Config(fmt.Sprintf("readbuffers%d", tc.readBuffers))
		cfg.SegmentSize = 1 << 20
		cfg.FlushInterval = time.Hour
		cfg.ReadBuffers = tc.readBuffers
		tr := openTier(t, cfg)
		keys := putUploaded(t, tr, 24, 100<<10)
		read := func() {
			var refs []*bufpool.Buffer
			must(t, tr.GetManyPooled(context.Background(), keys, func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
				must(t, err)
				refs = append(refs, ref)
			}))
			for _, ref := range refs { // all held until the read is over, as a restore's in flight are
				ref.Release()
			}
		}
		read()
		first := tr.S3Stats()
		read()
		if s := tr.S3Stats(); s.ReusedBuffers-first.ReusedBuffers != tc.reused {
			t.Errorf("ReadBuffers %d: the second read reused %d of its %d buffers, want %d",
				tc.readBuffers, s.ReusedBuffers-first.ReusedBuffers, s.ReadBuffers-first.ReadBuffers, tc.reused)
		}
	}
}

package ssd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// cachedPages returns how many pages of the file at path are in the page
// cache.
func cachedPages(t *testing.T, path string) uint64 {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		t.Skipf("cachestat: %v", err)
	}
	return cs.Cache
}

// dropPages writes the file at path back and drops its pages from the
// page cache, skipping the test if the kernel keeps some.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	must(t, f.Sync())
	must(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	must(t, f.Close())
	if n := cachedPages(t, path); n != 0 {
		t.Skipf("%d pages of %s still cached after FADV_DONTNEED", n, path)
	}
}

// putSized puts a block of each size, keys 1, 2, …, and returns them.
func putSized(t *testing.T, tr *Tier, sizes ...int) ([]index.Header, [][]byte) {
	t.Helper()
	var ms []index.Header
	var bs [][]byte
	for i, size := range sizes {
		m, b := tiertest.Block(index.Hash(i+1), size)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
		bs = append(bs, b)
	}
	return ms, bs
}

// GetManyPooled reads the files of large blocks none of whose pages is
// cached directly, whole, a block that is not a whole number of pages
// too, and leaves them uncached; a smaller block's file, and large ones
// whose pages are in the page cache (written and not yet flushed, here:
// dirty), are read through the page cache.
func TestGetManyReadsUncachedLargeBlocksDirectly(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 2})
	sizes := []int{1 << 20, bigBlock, directMin, 1 << 20, directMin - directAlign}
	const direct = 4 // the first four are large enough
	ms, bs := putSized(t, tr, sizes...)
	must(t, tr.Flush())
	var paths []string
	for _, m := range ms {
		paths = append(paths, blockFilePath(t, tr, m.Key))
	}
	for _, p := range paths {
		dropPages(t, p)
	}
	read := func() {
		t.Helper()
		must(t, tr.GetManyPooled(context.Background(), keysOf(ms), func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
			if err != nil || m != ms[i] || !bytes.Equal(v, bs[i]) {
				t.Errorf("block %d: %d bytes, %+v, %v", i, len(v), m, err)
			}
			ref.Release()
		}))
	}
	read()
	if tr.files.noDirect.Load() {
		t.Skip("the file system refuses direct reads")
	}
	if got := tr.files.directReads.Load(); got != direct {
		t.Fatalf("%d direct reads, want %d", got, direct)
	}
	for i, p := range paths {
		n := cachedPages(t, p)
		if i < direct && n != 0 {
			t.Errorf("block %d (%d bytes), read directly: %d pages cached", i, sizes[i], n)
		}
		if i >= direct && n == 0 {
			t.Errorf("block %d (%d bytes), read through the page cache: no page cached", i, sizes[i])
		}
	}

	// Blocks just put: their files' pages are in the page cache, dirty.
	before := tr.files.directReads.Load()
	ms, bs = putSized(t, tr, 1<<20, 1<<20, 1<<20)
	read()
	if got := tr.files.directReads.Load() - before; got != 0 {
		t.Fatalf("%d direct reads of files in the page cache, want none", got)
	}
}

// Get reads a large block directly into the caller's buffer when it is
// aligned and the block a whole number of pages; into any other buffer,
// or a block of another size, through the page cache. Both read the
// block whole.
func TestGetReadsDirectlyOnlyIntoAFittingBuffer(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30})
	ms, bs := putSized(t, tr, 1<<20, 1<<20, bigBlock)
	must(t, tr.Flush())
	for _, m := range ms {
		dropPages(t, blockFilePath(t, tr, m.Key))
	}
	aligned := make([]byte, 0, 1<<20) // a large allocation: page aligned
	unaligned := make([]byte, 1, 1<<20+1)
	for i, c := range []struct {
		dst    []byte
		opened int64 // files opened for a direct read
		cached bool  // read through the page cache
	}{
		{aligned, 1, false},
		{unaligned, 1, true}, // opened so, then read through the cache
		{nil, 0, true},       // bigBlock is no whole number of pages
	} {
		before := tr.files.directReads.Load()
		got, m, err := tr.Get(ms[i].Key, c.dst)
		if err != nil || m != ms[i] || !bytes.Equal(got[len(c.dst):], bs[i]) {
			t.Fatalf("Get %d: %d bytes, %+v, %v", i, len(got), m, err)
		}
		if tr.files.noDirect.Load() {
			t.Skip("the file system refuses direct reads")
		}
		if n := tr.files.directReads.Load() - before; n != c.opened {
			t.Errorf("Get %d: %d files opened for direct reads, want %d", i, n, c.opened)
		}
		if n := cachedPages(t, blockFilePath(t, tr, ms[i].Key)); (n > 0) != c.cached {
			t.Errorf("Get %d: %d pages cached after the read, want cached %v", i, n, c.cached)
		}
	}
}

// A file opened for a direct read reads into a buffer that does not fit
// one (misaligned, or without room for the rounding) through the page
// cache instead, whole.
func TestDirectFileReadsAnyBuffer(t *testing.T) {
	const size = 1<<20 + 100
	_, content := tiertest.Block(1, size)
	path := filepath.Join(t.TempDir(), "f")
	must(t, os.WriteFile(path, content, 0o644))
	backing := make([]byte, 2*size+2*directAlign)
	for _, p := range [][]byte{
		backing[1 : 1+size],  // misaligned
		backing[0:size:size], // no room to round up
		backing[0:size],      // fits
	} {
		fd, err := openRaw(path, unix.O_DIRECT)
		if errors.Is(err, unix.EINVAL) {
			t.Skip("the file system refuses O_DIRECT")
		}
		must(t, err)
		f := readFile{fd: &sharedFD{fd: fd, refs: 1, direct: true}, b: &blockFiles{fds: newFDCache(0)}}
		fits := directFits(p)
		n, err := f.readAt(p)
		if err != nil || n != size || !bytes.Equal(p, content) {
			t.Errorf("read into a buffer (fits %v): %d bytes, %v", fits, n, err)
		}
		if f.fd.direct != fits {
			t.Errorf("buffer fits %v: still direct %v", fits, f.fd.direct)
		}
		f.close(false)
	}
}

// Get asks the kernel for a block file ahead of its pread only where the
// pread would not read it whole at once: a block over syncReadAhead that
// is not known to be cached whole. It reads every block whole all the
// same. GetMany asks for every file it reads through the page cache,
// ahead of its reads.
func TestGetAsksForABlockFileOnlyWhenThePreadWouldNot(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30})
	sizes := []int{64 << 10, syncReadAhead, syncReadAhead + directAlign, 1 << 20, 1 << 20}
	ms, bs := putSized(t, tr, sizes...)
	must(t, tr.Flush())
	paths := make([]string, len(ms))
	for i, m := range ms {
		paths[i] = blockFilePath(t, tr, m.Key)
	}
	get := func(i int, dst []byte) {
		t.Helper()
		got, m, err := tr.Get(ms[i].Key, dst)
		if err != nil || m != ms[i] || !bytes.Equal(got[len(dst):], bs[i]) {
			t.Fatalf("Get %d: %d bytes, %+v, %v", i, len(got), m, err)
		}
	}
	aligned := make([]byte, 0, 1<<20) // a large allocation: page aligned
	for i, c := range []struct {
		dst     []byte
		cold    bool  // its pages dropped first
		partly  bool  // one page of it read back in first
		advised int64 // files asked for
	}{
		{nil, true, false, 0},        // 64 KiB, cold: the pread reads it whole
		{nil, true, false, 0},        // syncReadAhead, cold
		{nil, true, false, 1},        // over syncReadAhead, cold
		{aligned, false, false, 0},   // 1 MiB, cached whole (cachestat)
		{aligned[:1], true, true, 1}, // 1 MiB, partly cached: not direct, asked for
	} {
		if c.cold {
			dropPages(t, paths[i])
		}
		if c.partly {
			f, err := os.Open(paths[i])
			must(t, err)
			_, err = f.ReadAt(make([]byte, 1), 0)
			must(t, err)
			must(t, f.Close())
		}
		before := tr.files.advised.Load()
		get(i, c.dst)
		if n := tr.files.advised.Load() - before; n != c.advised {
			t.Errorf("Get %d (%d bytes): %d files asked for, want %d", i, sizes[i], n, c.advised)
		}
		if n, want := cachedPages(t, paths[i]), uint64(roundUp(sizes[i])/pageSize); n != want {
			t.Errorf("Get %d (%d bytes): %d pages cached after the read, want all %d", i, sizes[i], n, want)
		}
	}

	for _, p := range paths[:3] {
		dropPages(t, p)
	}
	before := tr.files.advised.Load()
	must(t, tr.GetMany(context.Background(), keysOf(ms[:3]), func(i int, v []byte, m index.Header, err error) {
		if err != nil || m != ms[i] || !bytes.Equal(v, bs[i]) {
			t.Errorf("GetMany %d: %d bytes, %+v, %v", i, len(v), m, err)
		}
	}))
	if n := tr.files.advised.Load() - before; n != 3 {
		t.Errorf("GetMany asked for %d files ahead, want all 3", n)
	}
}

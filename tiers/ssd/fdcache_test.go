package ssd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// deletedBlockFiles counts the descriptors the process holds on files
// under dir/blocks that were removed.
func deletedBlockFiles(t *testing.T, dir string) int {
	_, deleted := blockFileDescriptors(t, dir)
	return deleted
}

// Reads of small blocks' files keep the files open, up to OpenFiles, and
// read them again without opening them; an overwritten or deleted block
// reads as its record says, never through the file it had; no file of a
// block deleted or replaced stays open once its file is removed, and none
// stays open after Close.
func TestOpenFilesKeepsLiveFilesOpenAndNoOthers(t *testing.T) {
	const n, size = 8, 100 << 10
	tr := openTest(t, Config{Capacity: 1 << 30, OpenFiles: 4})
	dir := tr.cfg.Dir
	var ms []index.Header
	for i := 1; i <= n; i++ {
		m, b := tiertest.Block(index.Hash(i), size)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
	}
	must(t, tr.Flush())
	for _, m := range ms {
		for range 2 {
			v, gm, err := tr.Get(m.Key, nil)
			if err != nil || gm != m || index.Checksum(v) != m.Sum {
				t.Fatalf("Get %v: %d bytes, %+v, %v", m.Key, len(v), gm, err)
			}
		}
	}
	hits, opens, held := tr.files.fds.stats()
	if hits != n || opens != n || held != 4 {
		t.Fatalf("after two Gets of each of %d blocks: %d hits, %d opens, %d held; want %d, %d, 4",
			n, hits, opens, held, n, n)
	}
	if got := openBlockFiles(t, dir); got != 4 {
		t.Fatalf("%d block files open, want the 4 of OpenFiles", got)
	}

	// The last two blocks' files are open: replace one, delete the other.
	replaced, deleted := ms[n-1], ms[n-2]
	m2, b2 := tiertest.Block(replaced.Key.Hash, size+1)
	must(t, tr.Put(m2, b2))
	must(t, tr.Delete(deleted.Key))
	if v, gm, err := tr.Get(replaced.Key, nil); err != nil || gm != m2 || !bytes.Equal(v, b2) {
		t.Fatalf("Get of the replaced block: %d bytes, %+v, %v; want the new block", len(v), gm, err)
	}
	if _, _, err := tr.Get(deleted.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of the deleted block: %v, want ErrNotFound", err)
	}
	must(t, tr.Flush()) // removes the files of the old blocks
	if got := deletedBlockFiles(t, dir); got != 0 {
		t.Fatalf("%d removed block files still open", got)
	}
	must(t, tr.Close())
	if got := openBlockFiles(t, dir); got != 0 {
		t.Fatalf("%d block files open after Close", got)
	}
}

// A descriptor the cache lets go while a reader holds it stays open until
// that reader is done: its number is never reused under a read.
func TestFDCacheClosesADescriptorAfterItsLastHolder(t *testing.T) {
	dir := t.TempDir()
	open := func(gen uint64) *sharedFD {
		path := filepath.Join(dir, "f")
		must(t, os.WriteFile(path, []byte("block"), 0o644))
		fd, err := openRaw(path, 0)
		must(t, err)
		return &sharedFD{fd: fd, gen: gen, refs: 1}
	}
	isOpen := func(fd int) bool {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		return err == nil
	}
	c := newFDCache(1)
	a := c.add(open(1)) // held by the caller and the cache
	c.evict(1)
	b := c.add(open(2))
	d := c.add(open(3)) // pushes 2 out
	if !isOpen(a.fd) || !isOpen(b.fd) {
		t.Fatal("a descriptor a reader holds was closed when the cache let it go")
	}
	c.release(a)
	c.release(b)
	if isOpen(a.fd) || isOpen(b.fd) {
		t.Fatal("a descriptor stayed open after its last holder released it")
	}
	c.release(d)
	if !isOpen(d.fd) {
		t.Fatal("a cached descriptor was closed when its reader released it")
	}
	c.close()
	if isOpen(d.fd) {
		t.Fatal("a cached descriptor stayed open after the cache closed")
	}
	e := c.add(open(4)) // a closed cache keeps nothing
	if _, _, held := c.stats(); held != 0 {
		t.Fatalf("a closed cache holds %d descriptors", held)
	}
	c.release(e)
	if isOpen(e.fd) {
		t.Fatal("an uncached descriptor stayed open after its release")
	}
}

// Gets, GetManys, puts and deletes of the same small blocks at once, with
// two files kept open: every block read is whole and passes its checksum
// (a descriptor closed under a read, its number reused by another file,
// would read the wrong bytes), and no block file stays open after Close.
func TestOpenFilesUnderConcurrentReplaces(t *testing.T) {
	const keys, versions, size = 4, 3, 80 << 10
	tr := openTest(t, Config{Capacity: 1 << 30, OpenFiles: 2, FlushInterval: 5 * time.Millisecond})
	dir := tr.cfg.Dir
	put := func(k, v int) {
		m, b := tiertest.Block(index.Hash(k+1), size+v)
		must(t, tr.Put(m, b))
	}
	for k := range keys {
		put(k, 0)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	check := func(err error) {
		if err != nil && !errors.Is(err, tiers.ErrNotFound) {
			select {
			case errs <- err:
			default:
			}
		}
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				k := (i + w) % keys
				switch (i + w) % 5 {
				case 0:
					put(k, (i/5)%versions)
				case 1:
					if i%3 == 0 {
						m, _ := tiertest.Block(index.Hash(k+1), size)
						check(tr.Delete(m.Key))
					}
				case 2:
					ks := make([]index.Key, keys)
					for j := range ks {
						m, _ := tiertest.Block(index.Hash(j+1), size)
						ks[j] = m.Key
					}
					check(tr.GetManyPooled(context.Background(), ks, func(_ int, _ []byte, ref *bufpool.Buffer, _ index.Header, err error) {
						ref.Release()
						check(err)
					}))
				default:
					m, _ := tiertest.Block(index.Hash(k+1), size)
					_, _, err := tr.Get(m.Key, nil)
					check(err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	must(t, tr.Close())
	if got := openBlockFiles(t, dir); got != 0 {
		t.Fatalf("%d block files open after Close", got)
	}
}

func TestConfigOpenFiles(t *testing.T) {
	cfg := Config{Dir: "x", Capacity: 1 << 30, OpenFiles: -2}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "OpenFiles") {
		t.Fatalf("OpenFiles -2: %v", err)
	}
}

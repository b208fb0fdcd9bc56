package ssd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// bigBlock is the size of the blocks these tests read from the disk: large
// enough that Pebble's read of one is split (splitReadMin), not a multiple
// of the piece size.
const bigBlock = 3*splitReadPiece + 1000

// putChain puts blocks 1..n of size bytes (small instead for the
// indexes in small), flushes and reopens the tier, so that the blocks are
// read from blob files on disk, and returns the reopened tier and the
// blocks' metas and bytes.
func putChain(t *testing.T, tr *Tier, n, size int, small ...int) (*Tier, []index.Header, [][]byte) {
	t.Helper()
	var ms []index.Header
	var bs [][]byte
	for i := 1; i <= n; i++ {
		sz := size
		if slices.Contains(small, i-1) {
			sz = 5000
		}
		m, b := tiertest.Block(index.Hash(i), sz)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
		bs = append(bs, b)
	}
	must(t, tr.Flush())
	return reopen(t, tr), ms, bs
}

func keysOf(ms []index.Header) []index.Key {
	keys := make([]index.Key, len(ms))
	for i, m := range ms {
		keys[i] = m.Key
	}
	return keys
}

// A chain longer than the read window, read from the disk with one block
// damaged on disk and one missing: GetMany hands over every intact block
// whole, reports the damaged one as corrupt (Pebble's checksum of the
// block fails; the tier's own would catch what that missed) and drops it,
// and reports the missing one as not found. (The damaged block is a small
// one: on a checksum failure Pebble looks for a flipped bit by checksumming
// the block once per bit of its first 40 KiB, minutes for a large block.)
func TestGetManyReadsAChainFromDisk(t *testing.T) {
	const damaged = 6
	tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 3})
	tr, ms, bs := putChain(t, tr, 10, bigBlock, damaged)
	dir := tr.cfg.Dir
	must(t, tr.Close())
	damageOnDisk(t, dir, bs[damaged])
	tr = openTest(t, tr.cfg)

	missing := index.Key{NS: ms[0].Key.NS, Hash: 999}
	keys := append(keysOf(ms), missing)
	calls := make([]int, len(keys))
	must(t, tr.GetMany(context.Background(), keys, func(i int, v []byte, m index.Header, err error) {
		calls[i]++
		switch {
		case keys[i] == missing:
			if !errors.Is(err, tiers.ErrNotFound) {
				t.Errorf("missing block: %v, want ErrNotFound", err)
			}
		case i == damaged:
			if !errors.Is(err, tiers.ErrCorrupt) || v != nil {
				t.Errorf("damaged block: %d bytes, %v; want ErrCorrupt and no bytes", len(v), err)
			}
		case err != nil || m != ms[i] || !bytes.Equal(v, bs[i]):
			t.Errorf("block %d: %d bytes, %+v, %v", i, len(v), m, err)
		}
	}))
	for i, n := range calls {
		if n != 1 {
			t.Fatalf("fn called %d times for key %d", n, i)
		}
	}
	checkDropped(t, tr, ms[damaged], ms)
}

// damageOnDisk flips a byte in the middle of the one copy of b in dir's
// blob files.
func damageOnDisk(t *testing.T, dir string, b []byte) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.blob"))
	must(t, err)
	for _, name := range files {
		data, err := os.ReadFile(name)
		must(t, err)
		if at := bytes.Index(data, b); at >= 0 {
			data[at+len(b)/2] ^= 0x10
			must(t, os.WriteFile(name, data, 0o644))
			return
		}
	}
	t.Fatalf("no blob file in %s holds the block", dir)
}

// A read of large blocks that fails is an error for each block, not a
// corrupt block; the blocks read back once the disk answers again.
func TestGetManyOverFailingReads(t *testing.T) {
	disk := newFaultyDisk(t)
	tr := openFaulty(t, disk, time.Hour, DurabilityFlush)
	tr, ms, _ := putChain(t, tr, 5, bigBlock)
	disk.reads.Store(true)
	must(t, tr.GetMany(context.Background(), keysOf(ms), func(i int, v []byte, _ index.Header, err error) {
		if err == nil || errors.Is(err, tiers.ErrCorrupt) || errors.Is(err, tiers.ErrNotFound) || v != nil {
			t.Errorf("block %d while reads fail: %d bytes, %v; want an I/O error", i, len(v), err)
		}
		if !errors.Is(err, errorfs.ErrInjected) {
			t.Errorf("block %d while reads fail: %v does not wrap the disk's error", i, err)
		}
	}))
	disk.reads.Store(false)
	checkIntact(t, tr, ms)
	checkAccounting(t, tr)
}

// GetMany stops at a done context: it returns the context's error and
// calls fn for no key more than once.
func TestGetManyStopsWhenTheContextEnds(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 2})
	tr, ms, _ := putChain(t, tr, 8, bigBlock)
	ctx, cancel := context.WithCancel(context.Background())
	calls := make([]int, len(ms))
	err := tr.GetMany(ctx, keysOf(ms), func(i int, _ []byte, _ index.Header, err error) {
		calls[i]++
		cancel() // after the first block
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("GetMany cancelled after its first block: %v, want context.Canceled", err)
	}
	total := 0
	for i, n := range calls {
		if n > 1 {
			t.Fatalf("fn called %d times for key %d", n, i)
		}
		total += n
	}
	if total != 1 {
		t.Fatalf("fn called for %d keys after the context ended with the first", total)
	}
}

// A split read returns what one read of the file would: the same bytes,
// and at the end of the file the bytes there are with io.EOF.
func TestSplitReadIsOneRead(t *testing.T) {
	dir := t.TempDir()
	_, content := tiertest.Block(1, 5*splitReadPiece+100)
	name := filepath.Join(dir, "f")
	must(t, os.WriteFile(name, content, 0o644))
	fs := &countingFS{FS: vfs.Default}
	f, err := fs.Open(name)
	must(t, err)
	defer f.Close()
	for _, c := range []struct {
		off  int64
		size int
	}{
		{0, splitReadMin},
		{7, 2*splitReadPiece + 3},
		{100, 5 * splitReadPiece},                       // ends exactly at the end
		{int64(splitReadPiece) + 5, 4 * splitReadPiece}, // past the end, in the last piece
		{int64(3 * splitReadPiece), 3 * splitReadPiece}, // past the end, whole pieces beyond
		{int64(len(content)) + 10, splitReadMin + 1},    // wholly past the end
		{int64(splitReadPiece), splitReadMin - 1},       // not split
	} {
		got := make([]byte, c.size)
		n, err := f.ReadAt(got, c.off)
		want := content[min(c.off, int64(len(content))):min(c.off+int64(c.size), int64(len(content)))]
		if n != len(want) || !bytes.Equal(got[:n], want) {
			t.Errorf("ReadAt(%d bytes at %d) = %d bytes, want %d", c.size, c.off, n, len(want))
		}
		if short := n < c.size; short != errors.Is(err, io.EOF) || !short && err != nil {
			t.Errorf("ReadAt(%d bytes at %d) = %d bytes, %v", c.size, c.off, n, err)
		}
	}
}

func TestConfigReadWindow(t *testing.T) {
	cfg := Config{Dir: "x", Capacity: 1 << 30, ReadWindow: -1}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "ReadWindow") {
		t.Fatalf("ReadWindow -1: %v", err)
	}
}

// GetManyPooled reads a chain into the tier's buffers: each block whole,
// its reference the caller's; once released, the buffers serve the next
// chain's reads instead of fresh ones, and a block still held is not
// overwritten by them.
func TestGetManyPooledReusesBuffersOnceReleased(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 3})
	tr, ms, bs := putChain(t, tr, 8, bigBlock, 2)
	held := make([]*bufpool.Buffer, len(ms))
	read := func(keep int) {
		t.Helper()
		must(t, tr.GetManyPooled(context.Background(), keysOf(ms), func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
			if err != nil || m != ms[i] || !bytes.Equal(v, bs[i]) {
				t.Errorf("block %d: %d bytes, %+v, %v", i, len(v), m, err)
			}
			if i == keep {
				held[i] = ref
				return
			}
			ref.Release()
		}))
	}
	read(0)
	read(-1)
	if !bytes.Equal(held[0].Bytes(), bs[0]) {
		t.Fatal("a block still held was overwritten by a later read")
	}
	held[0].Release()
	if gets, reused, _ := tr.bufs.Stats(); reused == 0 {
		t.Fatalf("%d buffers lent, none reused", gets)
	}
}

func TestConfigReadAhead(t *testing.T) {
	cfg := Config{Dir: "x", Capacity: 1 << 30, ReadAhead: -1}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); !errors.Is(err, tiers.ErrInvalidConfig) || !strings.Contains(err.Error(), "ReadAhead") {
		t.Fatalf("ReadAhead -1: %v", err)
	}
}

// openBlockFiles counts the files under dir/blocks the process holds open.
func openBlockFiles(t *testing.T, dir string) int {
	open, _ := blockFileDescriptors(t, dir)
	return open
}

// blockFileDescriptors counts the descriptors the process holds on files
// under dir/blocks: all of them, and those of files since removed.
func blockFileDescriptors(t *testing.T, dir string) (open, deleted int) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	prefix := filepath.Join(dir, blocksDir) + string(filepath.Separator)
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil || !strings.HasPrefix(target, prefix) {
			continue
		}
		open++
		if strings.HasSuffix(target, " (deleted)") {
			deleted++
		}
	}
	return open, deleted
}

// GetMany opens block files ahead of its reads, up to ReadAhead bytes: a
// read ahead of a single block at a time and one of the whole chain both
// return every block whole, with blocks inline in Pebble among them, and
// no block file stays open once GetMany returns, whether it read every key
// or stopped early.
func TestGetManyReadsAheadAndClosesItsFiles(t *testing.T) {
	for _, ahead := range []int64{1, 1 << 30} {
		tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 2, ReadAhead: ahead})
		tr, ms, bs := putChain(t, tr, 24, bigBlock, 3, 10)
		dir := tr.cfg.Dir
		calls := make([]int, len(ms))
		must(t, tr.GetManyPooled(context.Background(), keysOf(ms), func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
			calls[i]++
			if err != nil || m != ms[i] || !bytes.Equal(v, bs[i]) {
				t.Errorf("ReadAhead %d: block %d: %d bytes, %+v, %v", ahead, i, len(v), m, err)
			}
			ref.Release()
		}))
		for i, n := range calls {
			if n != 1 {
				t.Fatalf("ReadAhead %d: fn called %d times for key %d", ahead, n, i)
			}
		}
		if n := openBlockFiles(t, dir); n != 0 {
			t.Fatalf("ReadAhead %d: %d block files open after GetMany read every key", ahead, n)
		}
		ctx, cancel := context.WithCancel(context.Background())
		err := tr.GetMany(ctx, keysOf(ms), func(int, []byte, index.Header, error) { cancel() })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ReadAhead %d: GetMany cancelled after its first block: %v", ahead, err)
		}
		if n := openBlockFiles(t, dir); n != 0 {
			t.Fatalf("ReadAhead %d: %d block files open after GetMany stopped early", ahead, n)
		}
	}
}

// A block deleted, or replaced, after GetMany opened its file ahead is
// read as it was when opened, whole and checked; the next read sees the
// change.
func TestGetManyReadsABlockAsItWasWhenOpened(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, ReadWindow: 1, ReadAhead: 1 << 30})
	tr, ms, bs := putChain(t, tr, 6, bigBlock)
	keys := keysOf(ms)
	// The opener runs ahead of the one reader: by the time fn has the
	// first block, later files may be open. Deleting the last key then
	// races with its open; either outcome is a whole block or not found.
	must(t, tr.GetMany(context.Background(), keys, func(i int, v []byte, m index.Header, err error) {
		if i == 0 {
			must(t, tr.Delete(keys[len(keys)-1]))
		}
		switch {
		case i == len(keys)-1 && errors.Is(err, tiers.ErrNotFound):
		case err != nil || m != ms[i] || !bytes.Equal(v, bs[i]):
			t.Errorf("block %d: %d bytes, %+v, %v", i, len(v), m, err)
		}
	}))
	if _, _, err := tr.Get(keys[len(keys)-1], nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of the deleted block after GetMany: %v, want ErrNotFound", err)
	}
}

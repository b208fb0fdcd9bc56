package ssd

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// smallDisk is the operating system's file system, limited to a size: it
// reports the free space of a file system of that size holding the files
// under dir, and a write that would take more fails with ENOSPC, as a full
// disk's does. Lowering the size is another process filling the disk.
type smallDisk struct {
	vfs.FS
	dir  string
	size atomic.Int64
}

func newSmallDisk(t *testing.T, size int64) *smallDisk {
	d := &smallDisk{FS: vfs.Default, dir: t.TempDir()}
	d.size.Store(size)
	return d
}

// used sums the sizes of the files under dir.
func (d *smallDisk) used() int64 {
	var n int64
	_ = filepath.WalkDir(d.dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if info, err := e.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

func (d *smallDisk) GetDiskUsage(string) (vfs.DiskUsage, error) {
	used, size := d.used(), d.size.Load()
	return vfs.DiskUsage{AvailBytes: uint64(max(0, size-used)), TotalBytes: uint64(size), UsedBytes: uint64(used)}, nil
}

func (d *smallDisk) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := d.FS.Create(name, c)
	return d.wrap(name, f, err)
}

func (d *smallDisk) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := d.FS.OpenReadWrite(name, c, opts...)
	return d.wrap(name, f, err)
}

func (d *smallDisk) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := d.FS.ReuseForWrite(oldname, newname, c)
	return d.wrap(newname, f, err)
}

func (d *smallDisk) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &smallFile{File: f, d: d, name: name}, nil
}

// leftOutputs lists the sstables and blob files under dir that are empty
// and stay so for a while: a flush or compaction in progress may have
// created its outputs and not yet written them.
func (d *smallDisk) leftOutputs() []string {
	before := d.emptyOutputs()
	time.Sleep(2 * time.Second)
	var out []string
	for _, name := range d.emptyOutputs() {
		if slices.Contains(before, name) {
			out = append(out, name)
		}
	}
	return out
}

// emptyOutputs lists the sstables and blob files of zero bytes under dir.
func (d *smallDisk) emptyOutputs() []string {
	var out []string
	entries, _ := os.ReadDir(d.dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Size() == 0 &&
			(strings.HasSuffix(e.Name(), ".sst") || strings.HasSuffix(e.Name(), ".blob")) {
			out = append(out, e.Name())
		}
	}
	return out
}

type smallFile struct {
	vfs.File
	d    *smallDisk
	name string
}

func (f *smallFile) Write(p []byte) (int, error) {
	if f.d.used()+int64(len(p)) > f.d.size.Load() {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.ENOSPC}
	}
	return f.File.Write(p)
}

func (f *smallFile) WriteAt(p []byte, off int64) (int, error) {
	if f.d.used()+int64(len(p)) > f.d.size.Load() {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: syscall.ENOSPC}
	}
	return f.File.WriteAt(p, off)
}

// logBuffer collects a tier's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// within runs fn and fails the test if it has not returned before
// deadline: what a hang looks like.
func within[T any](t *testing.T, deadline time.Duration, what string, fn func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- fn() }()
	select {
	case v := <-done:
		return v
	case <-time.After(deadline):
		t.Fatalf("%s did not answer before its %v deadline", what, deadline)
		panic("unreachable")
	}
}

// eventuallyTrue polls cond until it holds or timeout passes.
func eventuallyTrue(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
	}
}

const mib = 1 << 20

// A capacity over what the file system holds is warned about at Open; the
// tier fills the file system up to its reserve, then refuses puts with
// ErrNoSpace (not ErrFull: evicting does not free the disk at once),
// reports itself degraded and its capacity as what fits, and takes puts
// again by itself once space returns.
func TestCapacityOverTheFileSystemStopsAtTheReserve(t *testing.T) {
	disk := newSmallDisk(t, 48*mib)
	var log logBuffer
	tr := openTest(t, Config{Dir: disk.dir, FS: disk, Capacity: 1 << 30, MaxBlockSize: mib,
		DiskReserve: 8 * mib, MemTableSize: 8 * mib, FlushInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if !strings.Contains(log.String(), "capacity exceeds what the file system has room for") {
		t.Fatalf("no warning at open about a capacity over the file system's room; log:\n%s", log.String())
	}
	if c := tr.Stats().Capacity; c >= 48*mib {
		t.Errorf("Stats().Capacity = %s on a 48 MiB file system", units.FormatBytes(c))
	}

	var keys []index.Key
	var refused error
	for i := range 100 {
		m, b := tiertest.Block(index.Hash(i+1), mib)
		err := within(t, 30*time.Second, "a put to a filling disk", func() error { return tr.Put(m, b) })
		if err != nil {
			refused = err
			break
		}
		keys = append(keys, m.Key)
	}
	switch {
	case refused == nil:
		t.Fatal("100 MiB of puts on a 48 MiB file system: none refused")
	case !errors.Is(refused, tiers.ErrNoSpace) || errors.Is(refused, tiers.ErrFull):
		t.Fatalf("put on a full file system: %v, want ErrNoSpace and not ErrFull", refused)
	case len(keys) < 20:
		t.Fatalf("only %d blocks of 1 MiB fit on a 48 MiB file system with an 8 MiB reserve", len(keys))
	}
	if tr.Degraded() == nil {
		t.Error("Degraded() = nil while puts are refused for space")
	}
	if u := disk.used(); u > 48*mib {
		t.Errorf("the store takes %s on a 48 MiB disk", units.FormatBytes(u))
	}
	t.Logf("%d blocks fit; refused: %v; degraded: %v", len(keys), refused, tr.Degraded())
	for _, k := range keys {
		if _, _, err := tr.Get(k, nil); err != nil {
			t.Fatalf("get %v after the disk filled: %v", k, err)
		}
	}
	if err := within(t, 30*time.Second, "deleting from a full disk", func() error { return tr.Delete(keys[0]) }); err != nil {
		t.Fatalf("delete on a full disk: %v", err)
	}
	if err := within(t, 30*time.Second, "Flush on a full disk", tr.Flush); err != nil {
		t.Fatalf("Flush of what the tier accepted, on a disk full up to its reserve: %v", err)
	}
	if e := disk.leftOutputs(); len(e) > 0 {
		t.Errorf("empty outputs left: %v", e)
	}
	if strings.Contains(log.String(), "no space left on device") {
		t.Errorf("Pebble ran into ENOSPC although the tier kept its reserve; log:\n%s", log.String())
	}

	disk.size.Store(256 * mib) // space returns
	eventuallyTrue(t, 10*time.Second, "the tier taking puts again", func() bool { return tr.Degraded() == nil })
	m, b := tiertest.Block(1000, mib)
	if err := tr.Put(m, b); err != nil {
		t.Fatalf("put after space returned: %v", err)
	}
	if !strings.Contains(log.String(), "has room again") {
		t.Errorf("no log line when space returned; log:\n%s", log.String())
	}
}

// A disk that another process fills under the tier makes Pebble's flush
// fail with ENOSPC. Flush, Put and Delete answer (an error wrapping
// ErrNoSpace, or done) rather than wait for space, no empty output file is
// left behind, and once space returns the flush completes by itself and
// every block is there.
//
// The blocks are kept inline, so that the flush has their bytes to write.
func TestFlushFailingForSpaceAnswersAndRecovers(t *testing.T) {
	disk := newSmallDisk(t, 1<<30)
	tr := openTest(t, Config{Dir: disk.dir, FS: disk, Capacity: 1 << 30, MaxBlockSize: mib,
		DiskReserve: -1, FlushInterval: time.Hour, FileMinSize: 2 * mib}) // flushes only when asked
	var keys []index.Key
	for i := range 8 {
		m, b := tiertest.Block(index.Hash(i+1), mib)
		if err := tr.Put(m, b); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, m.Key)
	}

	disk.size.Store(disk.used() + 64<<10) // someone else takes all but 64 KiB
	err := within(t, 30*time.Second, "Flush on a full disk", tr.Flush)
	if !errors.Is(err, tiers.ErrNoSpace) {
		t.Fatalf("Flush on a full disk: %v, want ErrNoSpace", err)
	}
	if tr.Degraded() == nil {
		t.Error("Degraded() = nil after a flush failed for space")
	}
	m, b := tiertest.Block(100, mib)
	if err := within(t, 30*time.Second, "a put to a full disk", func() error { return tr.Put(m, b) }); !errors.Is(err, tiers.ErrNoSpace) {
		t.Fatalf("put on a full disk: %v, want ErrNoSpace", err)
	}
	if err := within(t, 30*time.Second, "a delete on a full disk", func() error { return tr.Delete(keys[7]) }); err != nil {
		t.Fatalf("delete on a full disk: %v", err)
	}
	time.Sleep(3 * spaceRetry) // Pebble retries the flush meanwhile
	if e := disk.leftOutputs(); len(e) > 0 {
		t.Errorf("empty outputs left by the failed flushes: %v", e)
	}

	disk.size.Store(1 << 30)
	eventuallyTrue(t, 10*time.Second, "the tier recovering", func() bool { return tr.Degraded() == nil })
	if err := within(t, 30*time.Second, "Flush after space returned", tr.Flush); err != nil {
		t.Fatalf("Flush after space returned: %v", err)
	}
	tr = reopen(t, tr) // what was flushed is on disk
	for _, k := range keys[:7] {
		if _, _, err := tr.Get(k, nil); err != nil {
			t.Fatalf("get %v after recovery and reopen: %v", k, err)
		}
	}
	if _, _, err := tr.Get(keys[7], nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("get of the block deleted on the full disk: %v, want ErrNotFound", err)
	}
}

// Close on a full disk answers: the puts since the last flush are lost, as
// in a crash, and the store opens again with what was flushed. The blocks
// are kept inline, so that the flush has their bytes to write.
func TestCloseOnAFullDiskAnswers(t *testing.T) {
	disk := newSmallDisk(t, 1<<30)
	cfg := Config{Dir: disk.dir, FS: disk, Capacity: 1 << 30, MaxBlockSize: mib, DiskReserve: -1,
		FlushInterval: time.Hour, Logger: testLogger(t), FileMinSize: 2 * mib}
	tr, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, b := tiertest.Block(1, mib)
	if err := tr.Put(m, b); err != nil {
		t.Fatal(err)
	}
	if err := tr.Flush(); err != nil {
		t.Fatal(err)
	}
	m2, b2 := tiertest.Block(2, mib)
	if err := tr.Put(m2, b2); err != nil {
		t.Fatal(err)
	}
	disk.size.Store(disk.used() + 64<<10)
	if err := within(t, 30*time.Second, "Close on a full disk", tr.Close); !errors.Is(err, tiers.ErrNoSpace) {
		t.Fatalf("Close on a full disk: %v, want an error wrapping ErrNoSpace", err)
	}
	disk.size.Store(1 << 30)
	tr = openTest(t, cfg)
	if _, _, err := tr.Get(m.Key, nil); err != nil {
		t.Fatalf("the flushed block after reopening: %v", err)
	}
	if _, _, err := tr.Get(m2.Key, nil); err != nil && !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("the unflushed block after reopening: %v, want it intact or missing", err)
	}
}

// BenchmarkSpaceCheck is what keeping within the file system adds to each
// Put: a statfs(2) and a lock.
func BenchmarkSpaceCheck(b *testing.B) {
	cfg := Config{Dir: b.TempDir(), Capacity: 1 << 30, Logger: testLogger(b)}
	cfg.EnsureDefaults()
	s := newSpace(&cfg)
	for b.Loop() {
		if err := s.check(mib); err != nil {
			b.Fatal(err)
		}
	}
}

// A block file whose write fails for want of space (another process
// filled the disk) fails its Put with ErrNoSpace and leaves no file
// behind; the tier refuses puts until space returns, then takes them.
func TestBlockFileWriteOnAFullDisk(t *testing.T) {
	disk := newSmallDisk(t, 1<<30)
	tr := openTest(t, Config{Dir: disk.dir, FS: disk, Capacity: 1 << 30, MaxBlockSize: mib,
		DiskReserve: -1, FlushInterval: time.Hour})
	m, b := tiertest.Block(1, mib)
	must(t, tr.Put(m, b))
	// The space check passes (the sample says there is room); the write
	// does not.
	tr.space.known = false
	disk.size.Store(disk.used() + 64<<10)
	m2, b2 := tiertest.Block(2, mib)
	if err := tr.Put(m2, b2); !errors.Is(err, tiers.ErrNoSpace) {
		t.Fatalf("put of a block file on a full disk: %v, want ErrNoSpace", err)
	}
	tr.space.known = true
	if tr.Degraded() == nil {
		t.Error("Degraded() = nil after a block file's write failed for space")
	}
	checkBlockFiles(t, tr)
	if _, _, err := tr.Get(m2.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("get of the refused block: %v, want ErrNotFound", err)
	}
	checkAccounting(t, tr)
	disk.size.Store(1 << 30)
	eventuallyTrue(t, 10*time.Second, "the tier taking puts again", func() bool { return tr.Degraded() == nil })
	must(t, tr.Put(m2, b2))
	checkIntact(t, tr, []index.Header{m, m2})
	checkBlockFiles(t, tr)
}

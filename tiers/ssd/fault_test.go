package ssd

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// faultyDisk is the operating system's file system with faults that a test
// switches on and off: errorfs fails the operations that match with
// errorfs.ErrInjected, an I/O error.
type faultyDisk struct {
	*errorfs.FS
	dir string
	// What fails while set: the creation of flush and compaction outputs
	// and writes to sstables; syncs of sstables; reads of blob files and
	// block files, which hold the blocks' bytes. (A failed sync of a blob file, or a failed
	// write of one that lands in its last flush, crashes Pebble v2.1.7: see
	// TestFailedBlobSyncIsAnError.) logs fails writes and syncs of the
	// tier's invalidation logs; blockWrites fails writes of block files.
	writes, syncs, reads, logs, blockWrites atomic.Bool
	injected                                atomic.Int64
}

func newFaultyDisk(t *testing.T) *faultyDisk {
	d := &faultyDisk{dir: t.TempDir()}
	d.FS = errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(d.maybeError))
	return d
}

func (d *faultyDisk) maybeError(op errorfs.Op) error {
	ext := filepath.Ext(op.Path)
	var fail bool
	if strings.HasPrefix(filepath.Base(op.Path), invalidatedPrefix) && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
		fail = d.logs.Load()
	}
	switch op.Kind {
	case errorfs.OpCreate:
		fail = d.writes.Load() && (ext == ".sst" || ext == ".blob")
	case errorfs.OpFileWrite, errorfs.OpFileWriteAt:
		fail = d.writes.Load() && ext == ".sst" || d.blockWrites.Load() && isBlockFile(op.Path)
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
		fail = fail || d.syncs.Load() && ext == ".sst"
	case errorfs.OpFileRead, errorfs.OpFileReadAt:
		fail = d.reads.Load() && (ext == ".blob" || isBlockFile(op.Path))
	}
	if !fail {
		return nil
	}
	d.injected.Add(1)
	return errorfs.ErrInjected
}

// isBlockFile reports whether path is in the block files' directory.
func isBlockFile(path string) bool {
	return strings.Contains(filepath.ToSlash(path), "/"+blocksDir+"/")
}

// openFaulty opens a tier on disk that flushes every interval (in
// DurabilityFlush mode) and keeps durability d; the faults are lifted before the tier closes at the end of the test.
func openFaulty(t *testing.T, disk *faultyDisk, interval time.Duration, d Durability) *Tier {
	tr := openTest(t, Config{Dir: disk.dir, FS: disk, Capacity: 1 << 30, MaxBlockSize: mib,
		FlushInterval: interval, Durability: d})
	t.Cleanup(func() {
		for _, on := range []*atomic.Bool{&disk.writes, &disk.syncs, &disk.reads, &disk.logs, &disk.blockWrites} {
			on.Store(false)
		}
	})
	return tr
}

// checkIntact fails the test unless every block of ms reads back whole.
func checkIntact(t *testing.T, tr *Tier, ms []index.Header) {
	t.Helper()
	for _, m := range ms {
		got, gm, err := tr.Get(m.Key, nil)
		if err != nil || gm != m || index.Checksum(got) != m.Sum {
			t.Fatalf("block %v: %+v, %v; want it intact", m.Key, gm, err)
		}
	}
}

// While the disk fails Pebble's writes of its flush outputs (creating,
// writing or syncing them), Flush says why it failed instead of waiting
// for ever, the tier refuses puts with ErrWriteFailing rather than fill
// its memtables until every put waits, Degraded says the tier is degraded,
// and every block already taken reads back intact. Once the fault is
// lifted, Pebble's retried flush succeeds and the tier takes puts again by
// itself; after a reopen, every block it acknowledged is there.
func TestFailedDiskWritesRefusePutsUntilAFlushSucceeds(t *testing.T) {
	for _, tc := range []struct {
		fault string
		d     Durability
	}{{"writes", DurabilityFlush}, {"syncs", DurabilityFlush}, {"writes", DurabilityWAL}, {"syncs", DurabilityWAL}} {
		t.Run(tc.fault+"/"+tc.d.String(), func(t *testing.T) {
			disk := newFaultyDisk(t)
			on := map[string]*atomic.Bool{"writes": &disk.writes, "syncs": &disk.syncs}[tc.fault]
			tr := openFaulty(t, disk, time.Hour, tc.d) // flushes only when asked
			var taken []index.Header
			put := func(i int) error {
				m, b := tiertest.Block(index.Hash(i), 64<<10)
				err := within(t, 10*time.Second, "a put", func() error { return tr.Put(m, b) })
				if err == nil {
					taken = append(taken, m)
				}
				return err
			}
			for i := 1; i <= 8; i++ {
				must(t, put(i))
			}
			must(t, tr.Flush())
			must(t, put(9)) // in the memtable only

			on.Store(true)
			if err := within(t, 30*time.Second, "Flush while writes fail", tr.Flush); !errors.Is(err, ErrWriteFailing) {
				t.Fatalf("Flush while writes fail: %v, want ErrWriteFailing", err)
			}
			if err := put(10); !errors.Is(err, ErrWriteFailing) {
				t.Fatalf("put while writes fail: %v, want ErrWriteFailing", err)
			}
			if err := tr.Degraded(); !errors.Is(err, ErrWriteFailing) {
				t.Fatalf("Degraded() while writes fail = %v, want ErrWriteFailing", err)
			}
			checkIntact(t, tr, taken)
			if err := within(t, 10*time.Second, "a delete", func() error { return tr.Delete(taken[0].Key) }); err != nil {
				t.Fatalf("delete while writes fail: %v", err)
			}
			taken = taken[1:]
			if err := within(t, 30*time.Second, "a second Flush while writes fail", tr.Flush); !errors.Is(err, ErrWriteFailing) {
				t.Fatalf("second Flush while writes fail: %v, want ErrWriteFailing", err)
			}

			on.Store(false)
			eventuallyTrue(t, 20*time.Second, "the tier taking puts again", func() bool { return tr.Degraded() == nil })
			if err := within(t, 30*time.Second, "Flush after the fault", tr.Flush); err != nil {
				t.Fatalf("Flush after the fault: %v", err)
			}
			must(t, put(11))
			tr = reopen(t, tr)
			checkIntact(t, tr, taken)
			checkAccounting(t, tr)
			if s := tr.Stats(); s.Blocks != int64(len(taken)) {
				t.Fatalf("after reopening: %d blocks, want %d", s.Blocks, len(taken))
			}
		})
	}
}

// A read of a block's bytes that fails is an error, not a corrupt block:
// the block stays, and reads back once the disk answers again. (Pebble's
// DB.Get returned the block as empty, with no error, and the tier dropped
// it as corrupt.)
func TestFailedReadIsAnErrorNotACorruptBlock(t *testing.T) {
	disk := newFaultyDisk(t)
	tr := openFaulty(t, disk, time.Hour, DurabilityFlush)
	ms := putBlocks(t, tr, 4)
	tr = reopen(t, tr) // nothing cached: reads go to the disk
	disk.reads.Store(true)
	got, _, err := tr.Get(ms[0].Key, nil)
	if err == nil || errors.Is(err, tiers.ErrCorrupt) || errors.Is(err, tiers.ErrNotFound) || got != nil {
		t.Fatalf("get while reads fail: %d bytes, %v; want an I/O error", len(got), err)
	}
	if !errors.Is(err, errorfs.ErrInjected) {
		t.Errorf("get while reads fail: %v does not wrap the disk's error", err)
	}
	if _, err := tr.Stat(ms[1].Key); err != nil {
		t.Fatalf("stat while blob reads fail: %v", err)
	}
	disk.reads.Store(false)
	checkIntact(t, tr, ms)
	checkAccounting(t, tr)
}

// A hierarchy over DRAM and an SSD whose disk fails its writes stays
// usable: puts land in DRAM, the SSD refuses the victims demoted to it
// (they are dropped, as at the bottom), reads of what each level holds
// return intact blocks, and the level reports itself degraded until the
// disk writes again, after which demotions into it resume.
func TestHierarchyOverAnSSDWhoseWritesFail(t *testing.T) {
	const size = 64 << 10
	disk := newFaultyDisk(t)
	ssdTier := openFaulty(t, disk, 50*time.Millisecond, DurabilityFlush)
	top, err := dram.New(dram.Config{Capacity: 4 * size, MaxBlockSize: size})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: top, HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: ssdTier},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	want := map[index.Key][]byte{}
	put := func(i int) {
		m, b := tiertest.Block(index.Hash(i), size)
		if err := within(t, 10*time.Second, "a hierarchy put", func() error { return h.Put(m, b) }); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		want[m.Key] = b
	}
	checkHeld := func() {
		t.Helper()
		for k, b := range want {
			got, _, _, err := h.Get(k, nil)
			if errors.Is(err, tiers.ErrNotFound) {
				continue // dropped: the SSD refused it
			}
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("get %v: %v; want it intact or missing", k, err)
			}
		}
	}
	for i := 1; i <= 8; i++ {
		put(i)
	}
	disk.writes.Store(true)
	i := 9
	eventuallyTrue(t, 20*time.Second, "the SSD level reporting itself degraded", func() bool {
		put(i)
		i++
		return errors.Is(h.Stats().Levels[1].Degraded, ErrWriteFailing)
	})
	for range 8 { // demotions into the SSD now fail
		put(i)
		i++
	}
	checkHeld()
	if s := h.Stats(); s.Levels[0].Drops == 0 {
		t.Errorf("no victim dropped while the SSD refused them: %+v", s.Levels[0])
	}

	disk.writes.Store(false)
	eventuallyTrue(t, 20*time.Second, "the SSD level recovering", func() bool { return h.Stats().Levels[1].Degraded == nil })
	before := h.Stats()
	for range 8 {
		put(i)
		i++
	}
	after := h.Stats()
	if after.Levels[1].Demotions == before.Levels[1].Demotions || after.Levels[0].Drops != before.Levels[0].Drops {
		t.Errorf("after recovery, 8 puts demoted %d blocks into the SSD and dropped %d, want some demoted and none dropped",
			after.Levels[1].Demotions-before.Levels[1].Demotions, after.Levels[0].Drops-before.Levels[0].Drops)
	}
	checkHeld()
}

// With a level below it, an SSD whose writes fail is passed over as a
// full one is: DRAM's victims go to the level below instead of being
// dropped.
func TestVictimsPassOverAnSSDWhoseWritesFail(t *testing.T) {
	const size = 64 << 10
	disk := newFaultyDisk(t)
	ssdTier := openFaulty(t, disk, 50*time.Millisecond, DurabilityFlush)
	newDRAM := func(blocks int64) tiers.Tier {
		d, err := dram.New(dram.Config{Capacity: blocks * size, MaxBlockSize: size})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(4), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: ssdTier},
		{Kind: index.TierS3, Tier: newDRAM(64), HighWatermark: 1, LowWatermark: 1}, // stands in for an object store
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	i := 1
	put := func() {
		m, b := tiertest.Block(index.Hash(i), size)
		if err := within(t, 10*time.Second, "a hierarchy put", func() error { return h.Put(m, b) }); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		i++
	}
	disk.writes.Store(true)
	eventuallyTrue(t, 20*time.Second, "the SSD level reporting itself degraded", func() bool {
		put()
		return errors.Is(h.Stats().Levels[1].Degraded, tiers.ErrDeviceFailing)
	})
	before := h.Stats()
	for range 8 {
		put()
	}
	after := h.Stats()
	if got := after.Levels[2].Demotions - before.Levels[2].Demotions; got != 8 {
		t.Errorf("8 victims while the SSD refused writes: %d went to the level below, want 8", got)
	}
	if got := after.Levels[0].Drops - before.Levels[0].Drops; got != 0 {
		t.Errorf("%d victims dropped with a level below the failing SSD, want 0", got)
	}
}

// An Invalidate whose log cannot be written falls back to a flush, which
// makes the deletion durable just the same: the old block does not come
// back after a reopen. When flushes fail too, Invalidate says so rather
// than return as if the deletion were durable.
func TestInvalidateOverAFailingLog(t *testing.T) {
	disk := newFaultyDisk(t)
	tr := openFaulty(t, disk, time.Hour, DurabilityFlush)
	ms := putBlocks(t, tr, 3)
	must(t, tr.Flush())

	disk.logs.Store(true)
	if err := within(t, 30*time.Second, "Invalidate over a failing log", func() error { return tr.Invalidate(ms[0].Key) }); err != nil {
		t.Fatalf("Invalidate over a failing log: %v, want the deletion made durable by a flush", err)
	}
	if tr.MayResurrect(ms[0].Key) {
		t.Fatal("MayResurrect after Invalidate returned")
	}
	disk.writes.Store(true)
	err := within(t, 30*time.Second, "Invalidate over a failing log and flush", func() error { return tr.Invalidate(ms[1].Key) })
	if !errors.Is(err, ErrWriteFailing) {
		t.Fatalf("Invalidate while the log and flushes fail: %v, want ErrWriteFailing", err)
	}
	disk.writes.Store(false)
	disk.logs.Store(false)
	eventuallyTrue(t, 20*time.Second, "the tier recovering", func() bool { return tr.Degraded() == nil })
	tr = reopen(t, tr)
	for _, m := range ms[:2] {
		if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("invalidated block %v after reopening: %v, want ErrNotFound", m.Key, err)
		}
	}
	checkIntact(t, tr, ms[2:])
}

// TestFailedBlobSyncIsAnError would check that a failed sync of a blob
// file fails its flush like that of an sstable. Pebble v2.1.7 crashes the
// process instead: blob.FileWriter.Close calls Abort on its writable after
// a failed Finish, which has already closed the file and set it to nil
// (objstorageprovider.fileBufferedWritable.Abort dereferences it). The
// same happens when the last buffered write of a blob file fails inside
// Finish. Nothing outside Pebble can catch it; the test is skipped until a
// Pebble release fixes it.
func TestFailedBlobSyncIsAnError(t *testing.T) {
	t.Skip("pebble v2.1.7: a failed sync of a blob file is a nil dereference in fileBufferedWritable.Abort")
}

// A block file whose write fails with an I/O error fails its Put with
// ErrWriteFailing and leaves no file behind; the tier refuses puts and
// reports itself degraded until a flush succeeds, and the blocks it holds
// read back intact meanwhile.
func TestFailedBlockFileWriteRefusesPutsUntilAFlushSucceeds(t *testing.T) {
	disk := newFaultyDisk(t)
	tr := openFaulty(t, disk, time.Hour, DurabilityFlush)
	var ms []index.Header
	for i := 1; i <= 4; i++ {
		m, b := tiertest.Block(index.Hash(i), 256<<10)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
	}
	disk.blockWrites.Store(true)
	m, b := tiertest.Block(5, 256<<10)
	if err := tr.Put(m, b); !errors.Is(err, ErrWriteFailing) || !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("put while block file writes fail: %v, want ErrWriteFailing wrapping the disk's error", err)
	}
	if err := tr.Degraded(); !errors.Is(err, ErrWriteFailing) {
		t.Fatalf("Degraded() after a block file write failed = %v, want ErrWriteFailing", err)
	}
	small, sb := tiertest.Block(6, 1000) // inline: refused all the same
	if err := tr.Put(small, sb); !errors.Is(err, ErrWriteFailing) {
		t.Fatalf("put of an inline block after a block file write failed: %v, want ErrWriteFailing", err)
	}
	checkIntact(t, tr, ms)
	checkBlockFiles(t, tr)
	disk.blockWrites.Store(false)
	must(t, tr.Flush())
	if err := tr.Degraded(); err != nil {
		t.Fatalf("Degraded() after a flush succeeded: %v", err)
	}
	must(t, tr.Put(m, b))
	tr = reopen(t, tr)
	checkIntact(t, tr, append(ms, m))
	checkBlockFiles(t, tr)
	checkAccounting(t, tr)
}

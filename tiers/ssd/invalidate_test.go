package ssd

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// crashCopy copies tr's store into a new directory: what a kill -9 at
// this instant could leave on disk (the memtable is lost, the files keep
// what was written to them). The caller writes nothing to tr meanwhile;
// the tiers under test flush only when told.
//
// Pebble is not idle when the tier is: a flush may schedule compactions,
// which write new sstables, log them in the MANIFEST and remove the files
// they replace, in the background. A copy of the directory file by file
// can therefore miss a file that the copied MANIFEST names, or find one
// gone between listing and copying it: no crash leaves that. Pebble's
// checkpoint is a consistent set instead, taken with file deletions
// paused: the MANIFEST up to its current version, the sstables and blob
// files of that version, the WAL and the OPTIONS. Only the tier's methods
// write its own files, the invalidation logs and the block files, so
// they are copied as they are.
func crashCopy(t *testing.T, tr *Tier) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "crashed")
	must(t, tr.db.Checkpoint(to))
	for _, name := range invalLogs(t, tr.cfg.Dir) {
		copyFile(t, filepath.Join(tr.cfg.Dir, name), filepath.Join(to, name))
	}
	copyTree(t, filepath.Join(tr.cfg.Dir, blocksDir), filepath.Join(to, blocksDir))
	return to
}

// copyTree copies the directories and regular files under dir into to.
func copyTree(t *testing.T, dir, to string) {
	t.Helper()
	must(t, os.MkdirAll(to, 0o755))
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		switch {
		case e.IsDir():
			copyTree(t, filepath.Join(dir, e.Name()), filepath.Join(to, e.Name()))
		case e.Type().IsRegular():
			copyFile(t, filepath.Join(dir, e.Name()), filepath.Join(to, e.Name()))
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	must(t, err)
	defer src.Close()
	dst, err := os.Create(to)
	must(t, err)
	_, err = io.Copy(dst, src)
	must(t, err)
	must(t, dst.Close())
}

func invalLogs(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), invalidatedPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestInvalidatedBlocksStayDeletedAfterACrash(t *testing.T) {
	for _, d := range []Durability{DurabilityFlush, DurabilityWAL} {
		t.Run(d.String(), func(t *testing.T) {
			cfg := Config{Capacity: 1 << 30, Durability: d, FlushInterval: time.Hour}
			tr := openTest(t, cfg)
			const n = 64
			for i := range n {
				m, b := tiertest.Block(index.Hash(i), 4096)
				must(t, tr.Put(m, b))
			}
			must(t, tr.Flush())
			// Even keys: a plain Delete. Odd keys: Invalidate, half of them
			// after a plain Delete (the block is gone, the deletion not yet
			// durable), the others while the block is there.
			var wg sync.WaitGroup
			for i := range n {
				k := index.Key{NS: 7, Hash: index.Hash(i)}
				if i%2 == 0 || i%4 == 3 {
					must(t, tr.Delete(k))
				}
				if d == DurabilityFlush && !tr.MayResurrect(k) == (i%2 == 0 || i%4 == 3) {
					t.Fatalf("key %d: MayResurrect = %v after %s", i, tr.MayResurrect(k),
						map[bool]string{true: "a Delete", false: "no Delete"}[i%2 == 0 || i%4 == 3])
				}
				if i%2 == 1 {
					wg.Go(func() { must(t, tr.Invalidate(k)) }) // concurrent: one sync for many
				}
			}
			wg.Wait()
			for i := 1; i < n; i += 2 {
				k := index.Key{NS: 7, Hash: index.Hash(i)}
				if tr.MayResurrect(k) {
					t.Fatalf("key %d may come back after Invalidate returned", i)
				}
				if _, err := tr.Stat(k); !errors.Is(err, tiers.ErrNotFound) {
					t.Fatalf("key %d after Invalidate: %v", i, err)
				}
			}
			checkAccounting(t, tr)

			crashed := openTest(t, Config{Dir: crashCopy(t, tr), Capacity: 1 << 30, Durability: d})
			back := 0
			for i := range n {
				_, err := crashed.Stat(index.Key{NS: 7, Hash: index.Hash(i)})
				switch {
				case i%2 == 1 && !errors.Is(err, tiers.ErrNotFound):
					t.Errorf("key %d was invalidated before the crash and reads %v after it", i, err)
				case i%2 == 0 && err == nil:
					back++
				}
			}
			if d == DurabilityFlush && back != n/2 {
				// Without a WAL a plain Delete is lost with the memtable: the
				// contrast that makes Invalidate needed.
				t.Errorf("%d of %d plainly deleted blocks came back, want all", back, n/2)
			}
			checkAccounting(t, crashed)
			if logs := invalLogs(t, crashed.cfg.Dir); len(logs) != 0 {
				t.Errorf("Open left the invalidation logs %v", logs)
			}
		})
	}
}

func TestFlushRemovesTheInvalidationLogsItCovers(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, FlushInterval: time.Hour})
	m, b := tiertest.Block(1, 4096)
	must(t, tr.Put(m, b))
	must(t, tr.Invalidate(m.Key))
	if logs := invalLogs(t, tr.cfg.Dir); len(logs) != 1 {
		t.Fatalf("logs after an Invalidate: %v, want one", logs)
	}
	must(t, tr.Flush())
	if logs := invalLogs(t, tr.cfg.Dir); len(logs) != 0 {
		t.Fatalf("logs after a flush: %v, want none", logs)
	}
	// Put again after the flush: a later crash keeps the new block, which
	// no log names any more.
	must(t, tr.Put(m, b))
	must(t, tr.Flush())
	crashed := openTest(t, Config{Dir: crashCopy(t, tr), Capacity: 1 << 30})
	if _, err := crashed.Stat(m.Key); err != nil {
		t.Fatalf("a block put again after its invalidation was flushed: %v", err)
	}
}

func TestPutsAndPlainDeletesWriteNoInvalidationLog(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, FlushInterval: time.Hour})
	for i := range 16 {
		m, b := tiertest.Block(index.Hash(i), 4096)
		must(t, tr.Put(m, b))
		must(t, tr.Delete(m.Key))
		if tr.MayResurrect(index.Key{NS: 7, Hash: index.Hash(i + 100)}) {
			t.Fatal("a key never put may come back")
		}
	}
	if logs := invalLogs(t, tr.cfg.Dir); len(logs) != 0 {
		t.Fatalf("logs %v", logs)
	}
}

func TestTornInvalidationRecordIsIgnored(t *testing.T) {
	dir := t.TempDir()
	tr := openTest(t, Config{Dir: dir, Capacity: 1 << 30, FlushInterval: time.Hour})
	for i := range 3 {
		m, b := tiertest.Block(index.Hash(i), 4096)
		must(t, tr.Put(m, b))
	}
	must(t, tr.Flush())
	must(t, tr.Invalidate(index.Key{NS: 7, Hash: 0}))
	crashed := crashCopy(t, tr)
	logs := invalLogs(t, crashed)
	if len(logs) != 1 {
		t.Fatalf("logs %v", logs)
	}
	// A second record, torn: the crash came while it was written, so it
	// was never acknowledged and must not delete block 1.
	f, err := os.OpenFile(filepath.Join(crashed, logs[0]), os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write([]byte{7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 9})
	must(t, err)
	must(t, f.Close())
	re := openTest(t, Config{Dir: crashed, Capacity: 1 << 30})
	if _, err := re.Stat(index.Key{NS: 7, Hash: 0}); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("invalidated block: %v", err)
	}
	for i := 1; i < 3; i++ {
		if _, err := re.Stat(index.Key{NS: 7, Hash: index.Hash(i)}); err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
	}
	if s := re.Stats(); s.Blocks != 2 {
		t.Fatalf("Stats %+v, want 2 blocks", s)
	}
}

// BenchmarkMayResurrect is what a Put of a new key pays in the hierarchy
// for each SSD level below: one lookup in the map of deletes not yet
// durable, here holding 10,000 of them.
func BenchmarkMayResurrect(b *testing.B) {
	tr := openTest(b, Config{Capacity: 1 << 30, FlushInterval: time.Hour})
	for i := range 10000 {
		tr.dels.mark(index.Key{NS: 7, Hash: index.Hash(i)})
	}
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if tr.MayResurrect(index.Key{NS: 8, Hash: index.Hash(i)}) {
				b.Fatal("a key never deleted may come back")
			}
			i++
		}
	})
}

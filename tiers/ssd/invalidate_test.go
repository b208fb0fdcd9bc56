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

// crashCopy copies the files of an open tier's directory into a new
// directory: what a kill -9 at this instant would leave on disk (the
// memtable is lost, the files keep what was written to them). The tiers
// under test flush only when told, so no flush runs during the copy.
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	copyTree(t, dir, to)
	return to
}

// copyTree copies the regular files under dir, but the lock, into to.
func copyTree(t *testing.T, dir, to string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	for _, e := range ents {
		if e.IsDir() {
			must(t, os.MkdirAll(filepath.Join(to, e.Name()), 0o755))
			copyTree(t, filepath.Join(dir, e.Name()), filepath.Join(to, e.Name()))
			continue
		}
		if e.Name() == "LOCK" || !e.Type().IsRegular() {
			continue
		}
		src, err := os.Open(filepath.Join(dir, e.Name()))
		must(t, err)
		dst, err := os.Create(filepath.Join(to, e.Name()))
		must(t, err)
		_, err = io.Copy(dst, src)
		must(t, err)
		must(t, src.Close())
		must(t, dst.Close())
	}
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

			crashed := openTest(t, Config{Dir: crashCopy(t, tr.cfg.Dir), Capacity: 1 << 30, Durability: d})
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
	crashed := openTest(t, Config{Dir: crashCopy(t, tr.cfg.Dir), Capacity: 1 << 30})
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
	crashed := crashCopy(t, dir)
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

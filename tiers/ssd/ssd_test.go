package ssd

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
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

// openTest opens a tier on cfg, with a test logger, and closes it when the
// test ends.
func openTest(t testing.TB, cfg Config) *Tier {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	tr, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// reopen closes tr and opens its store again.
func reopen(t testing.TB, tr *Tier) *Tier {
	t.Helper()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	return openTest(t, tr.cfg)
}

// TestConformance runs the suite in both durability modes, with the
// default FileMinSize (most of the suite's blocks inline, in Pebble) and
// with a FileMinSize of 4 KiB (most in block files).
func TestConformance(t *testing.T) {
	for _, d := range []Durability{DurabilityFlush, DurabilityWAL} {
		t.Run(d.String(), func(t *testing.T) {
			tiertest.Run(t, factory(d))
		})
		t.Run(d.String()+"/files", func(t *testing.T) {
			f := factory(d)
			f.New = func(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
				return openTest(tb, Config{Capacity: capacity, MaxBlockSize: maxBlock, Durability: d, FileMinSize: 4 << 10})
			}
			tiertest.Run(t, f)
		})
	}
}

// factory opens SSD tiers of durability d for the conformance suite and
// the shared benchmark.
func factory(d Durability) tiertest.Factory {
	return tiertest.Factory{
		New: func(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
			return openTest(tb, Config{Capacity: capacity, MaxBlockSize: maxBlock, Durability: d})
		},
		Reopen: func(tb testing.TB, tr tiers.Tier) tiers.Tier {
			return reopen(tb, tr.(*Tier))
		},
		Overhead: RecordOverhead,
		Flush: func(tb testing.TB, tr tiers.Tier) {
			if err := tr.(*Tier).Flush(); err != nil {
				tb.Fatal(err)
			}
		},
		Corrupt: func(tb testing.TB, tr tiers.Tier, key index.Key) {
			if path := blockFilePath(tb, tr.(*Tier), key); path != "" {
				flipFileByte(tb, path) // a flipped byte in the block file
				return
			}
			pk := makeKey(prefixPayload, key) // a flipped byte in the Pebble value
			v := getRaw(tb, tr.(*Tier), pk[:])
			v[len(v)/2] ^= 0x10
			setRaw(tb, tr.(*Tier), pk[:], v)
		},
	}
}

func TestConfigValidateReportsEveryProblem(t *testing.T) {
	cfg := Config{
		Capacity:               -1,
		MaxBlockSize:           -5,
		Durability:             9,
		FlushInterval:          -time.Second,
		MemTableSize:           -1,
		CacheSize:              -1,
		ValueSeparationMinSize: -1,
		FileMinSize:            -1,
		ReadWindow:             -1,
		RecordCache:            -2,
	}
	cfg.EnsureDefaults()
	err := cfg.Validate()
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Validate: %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Dir", "Capacity", "MaxBlockSize", "Durability", "FlushInterval",
		"MemTableSize", "CacheSize", "ValueSeparationMinSize", "FileMinSize", "ReadWindow", "RecordCache"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not mention %s: %v", field, err)
		}
	}
	if _, err := Open(cfg); !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Open: %v, want ErrInvalidConfig", err)
	}

	cfg = Config{Dir: "x", Capacity: 1 << 20, MaxBlockSize: 2 << 20}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "over Capacity") {
		t.Fatalf("MaxBlockSize over Capacity: %v", err)
	}
	cfg = Config{Dir: "x", Capacity: 1 << 20, MaxBlockSize: MaxBlockLimit + 1}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("MaxBlockSize over the limit: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg := Config{Dir: "x", Capacity: 1 << 30}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Dir: "x", Capacity: 1 << 30, MaxBlockSize: DefaultMaxBlockSize,
		Durability: DurabilityFlush, FlushInterval: DefaultFlushInterval,
		MemTableSize: DefaultMemTableSize, CacheSize: DefaultCacheSize,
		ValueSeparationMinSize: DefaultValueSeparationMinSize, ReadWindow: DefaultReadWindow,
		ReadAhead:   DefaultReadAhead,
		FileMinSize: DefaultFileMinSize, OpenFiles: DefaultOpenFiles, RecordCache: DefaultRecordCache,
		Logger: slog.Default(), FS: vfs.Default,
	}
	if cfg != want {
		t.Fatalf("defaults %+v, want %+v", cfg, want)
	}
	small := Config{Dir: "x", Capacity: 1 << 20}
	small.EnsureDefaults()
	if small.MaxBlockSize != 1<<20 {
		t.Fatalf("MaxBlockSize default for a 1 MiB tier is %d, want the capacity", small.MaxBlockSize)
	}
}

func TestPutReplaceCountsTheDifference(t *testing.T) {
	const size = 10000
	tr := openTest(t, Config{Capacity: size + RecordOverhead, MaxBlockSize: size + 1})
	m, b := tiertest.Block(1, size)
	must(t, tr.Put(m, b))
	must(t, tr.Put(m, b)) // same size: fits exactly
	want := tiers.Stats{Capacity: size + RecordOverhead, Used: size + RecordOverhead, Blocks: 1}
	big, bb := tiertest.Block(1, size+1)
	if err := tr.Put(big, bb); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("growing replace over capacity: %v, want ErrFull", err)
	}
	if s := tr.Stats(); s != want {
		t.Fatalf("refused replace changed stats: %+v, want %+v", s, want)
	}
	if _, gm, err := tr.Get(m.Key, nil); err != nil || gm != m {
		t.Fatalf("refused replace changed the block: %+v, %v", gm, err)
	}
	other, ob := tiertest.Block(2, 1)
	if err := tr.Put(other, ob); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("new block in a full tier: %v, want ErrFull", err)
	}
	smaller, sb := tiertest.Block(1, 100)
	must(t, tr.Put(smaller, sb))
	if s := tr.Stats(); s.Used != 100+RecordOverhead || s.Blocks != 1 {
		t.Fatalf("after shrinking replace: %+v", s)
	}
}

// TestConcurrentAccountingIsExact races puts, replaces and deletes of a
// few shared keys and checks that Used and Blocks equal what the records
// say.
func TestConcurrentAccountingIsExact(t *testing.T) {
	tr := openTest(t, Config{Capacity: 64 << 20, MaxBlockSize: 64 << 10})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 300 {
				h := index.Hash(r.IntN(24))
				if r.IntN(4) == 0 {
					if err := tr.Delete(index.Key{NS: 7, Hash: h}); err != nil && !errors.Is(err, tiers.ErrNotFound) {
						t.Error(err)
					}
					continue
				}
				m, b := tiertest.Block(h, r.IntN(8<<10))
				if err := tr.Put(m, b); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	checkAccounting(t, tr)
	checkAccounting(t, reopen(t, tr))
}

// checkAccounting checks that Stats equals the sums over Scan, and that
// every block reads back intact.
func checkAccounting(t *testing.T, tr *Tier) {
	t.Helper()
	var want tiers.Stats
	must(t, tr.Scan(func(m index.Header) bool {
		want.Used += cost(m.Size)
		want.Blocks++
		got, gm, err := tr.Get(m.Key, nil)
		if err != nil || gm != m || index.Checksum(got) != m.Sum {
			t.Errorf("block %v: meta %+v, err %v", m.Key, gm, err)
		}
		return true
	}))
	got := tr.Stats()
	want.Capacity = got.Capacity
	if got != want {
		t.Fatalf("Stats %+v, Scan finds %+v", got, want)
	}
}

func TestClosedTierRefusesEverything(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 20})
	m, b := tiertest.Block(1, 10)
	must(t, tr.Put(m, b))
	must(t, tr.Close())
	for name, err := range map[string]error{
		"Put":    tr.Put(m, b),
		"Stat":   func() error { _, err := tr.Stat(m.Key); return err }(),
		"Delete": tr.Delete(m.Key),
		"Scan":   tr.Scan(func(index.Header) bool { return true }),
		"Flush":  tr.Flush(),
	} {
		if !errors.Is(err, tiers.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if ws := tr.WriteStats(); ws != (WriteStats{}) {
		t.Fatalf("WriteStats after Close: %+v", ws)
	}
	if n := tr.DiskUsage(); n != 0 {
		t.Fatalf("DiskUsage after Close: %d", n)
	}
}

func TestOpenRefusesForeignPebbleStore(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{testLogger(t)}})
	must(t, err)
	must(t, db.Set([]byte("someone else's"), []byte("data"), pebble.Sync))
	must(t, db.Close())
	if _, err := Open(Config{Dir: dir, Capacity: 1 << 20, Logger: testLogger(t)}); err == nil ||
		!strings.Contains(err.Error(), "not an ssd tier") {
		t.Fatalf("Open of a foreign store: %v", err)
	}
}

// TestWriteAmplification checks the figures that chose the default
// durability: about one byte written per byte put without the WAL, two
// with it for blocks kept inline; one for blocks in block files, whose
// bytes the WAL does not carry.
func TestWriteAmplification(t *testing.T) {
	for _, c := range []struct {
		d        Durability
		fileMin  int64
		min, max float64
	}{
		{DurabilityFlush, 0, 1.0, 1.1}, {DurabilityWAL, 0, 1.0, 1.1},
		{DurabilityFlush, 1 << 20, 1.0, 1.1}, {DurabilityWAL, 1 << 20, 2.0, 2.2},
	} {
		name := c.d.String() + "/files"
		if c.fileMin > 0 {
			name = c.d.String() + "/inline"
		}
		t.Run(name, func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 30, Durability: c.d, FileMinSize: c.fileMin})
			for i := range 32 {
				m, b := tiertest.Block(index.Hash(i), 256<<10)
				must(t, tr.Put(m, b))
			}
			must(t, tr.Flush())
			if n := tr.DiskUsage(); n < 32*256<<10 {
				t.Fatalf("DiskUsage %d after putting %d bytes", n, 32*256<<10)
			}
			ws := tr.WriteStats()
			if wa := ws.WriteAmp(); wa < c.min || wa > c.max {
				t.Fatalf("write amplification %.3f (%+v), want %.1f to %.1f", wa, ws, c.min, c.max)
			}
			// The counted bytes agree with Pebble's metrics, read with
			// care: in v2.1.7 a flush counts its blob file in both
			// BlobBytesFlushed and BlobBytesCompacted (so the latter alone
			// is every blob byte), and WAL.BytesWritten is an estimate that
			// is not zero without a WAL.
			m := tr.db.Metrics()
			var tables, blobs uint64
			for _, l := range m.Levels {
				tables += l.TableBytesFlushed + l.TableBytesCompacted
				blobs += l.BlobBytesCompacted
			}
			if got, want := int64(tables+blobs), ws.FlushBytes+ws.CompactionBytes; got != want {
				t.Errorf("Pebble's metrics say %d bytes of sstables and blob files, the filesystem saw %d", got, want)
			}
			if wal := int64(m.WAL.BytesIn); wal > ws.WALBytes || (c.d == DurabilityWAL) != (wal > 0) {
				t.Errorf("Pebble's WAL took %d bytes, the filesystem saw %d", wal, ws.WALBytes)
			}
		})
	}
}

// TestBackgroundFlush checks that without a WAL the tier flushes on its
// own once writes stop.
func TestBackgroundFlush(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 20, FlushInterval: 20 * time.Millisecond})
	flushes := func() int64 { return tr.db.Metrics().Flush.Count }
	before := flushes()
	m, b := tiertest.Block(1, 4096)
	must(t, tr.Put(m, b))
	deadline := time.Now().Add(5 * time.Second)
	for flushes() == before {
		if time.Now().After(deadline) {
			t.Fatal("no background flush within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if tr.dirty.Load() {
		t.Fatal("tier still dirty after its flush")
	}
}

// TestBlockOverHalfAMemtable covers blocks that Pebble commits as a batch
// of their own rather than through the memtable.
func TestBlockOverHalfAMemtable(t *testing.T) {
	for _, d := range []Durability{DurabilityFlush, DurabilityWAL} {
		t.Run(d.String(), func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 64 << 20, MaxBlockSize: 3 << 20, MemTableSize: 4 << 20, Durability: d})
			var ms []index.Header
			for i := range 3 {
				m, b := tiertest.Block(index.Hash(i), 3<<20-i)
				must(t, tr.Put(m, b))
				ms = append(ms, m)
			}
			tr = reopen(t, tr)
			for _, m := range ms {
				if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m || index.Checksum(got) != m.Sum {
					t.Fatalf("block %v after reopen: %+v, %v", m.Key, gm, err)
				}
			}
			checkAccounting(t, tr)
		})
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A store of format 1, whose blocks are all inline with records of
// version 1, opens as it is: its blocks read back, the store is marked
// format 2, and new large blocks go to block files.
func TestOpenTakesOverAFormat1Store(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, FileMinSize: 1 << 30 >> 2})
	var ms []index.Header
	for i := 1; i <= 4; i++ {
		m, b := tiertest.Block(index.Hash(i), i*60<<10)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
		rk := makeKey(prefixRecord, m.Key) // as format 1 wrote it
		setRaw(t, tr, rk[:], encodeRecordV1(nil, m))
	}
	setRaw(t, tr, formatKey, formatVersion1)
	cfg := tr.cfg
	must(t, tr.Close())
	must(t, os.RemoveAll(filepath.Join(cfg.Dir, blocksDir))) // format 1 had none

	cfg.FileMinSize = 0
	tr = openTest(t, cfg)
	checkIntact(t, tr, ms)
	checkAccounting(t, tr)
	if v := getRaw(t, tr, formatKey); string(v) != string(formatVersion) {
		t.Fatalf("format marker %q after the takeover, want %q", v, formatVersion)
	}
	m, b := tiertest.Block(9, 1<<20)
	must(t, tr.Put(m, b))
	if blockFilePath(t, tr, m.Key) == "" {
		t.Fatal("a new 1 MiB block is kept inline")
	}
	m2, b2 := tiertest.Block(ms[3].Key.Hash, 1<<20) // replaces an inline block
	must(t, tr.Put(m2, b2))
	tr = reopen(t, tr)
	checkIntact(t, tr, append(ms[:3], m, m2))
	checkAccounting(t, tr)
	checkBlockFiles(t, tr)
	if hasRaw(t, tr, func() []byte { pk := makeKey(prefixPayload, m2.Key); return pk[:] }()) {
		t.Fatal("the inline value of a block replaced by one in a file is still stored")
	}
}

// A store of a format this build does not know (written by a newer one)
// is refused with an error that names the directory and the formats.
func TestOpenRefusesAnUnknownFormat(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 20})
	setRaw(t, tr, formatKey, []byte("3"))
	cfg := tr.cfg
	must(t, tr.Close())
	_, err := Open(cfg)
	if err == nil {
		t.Fatal("Open of a store of format 3 succeeded")
	}
	for _, want := range []string{cfg.Dir, `"3"`, `"2"`, "remove the directory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a store of format 3: %v; does not say %s", err, want)
		}
	}
}

package ssd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// The benchmarks put and get 1 MiB blocks next to plain sequential file
// writes and reads of the same bytes in the same kind of directory, so
// that one run gives the ratios; bench/ssd-fio.sh adds fio's figures for
// the disk itself. They run in t.TempDir(), or under $KVSTRATA_BENCH_DIR.
//
// Write benchmarks end with a sync: Flush for the tier (Pebble syncs the
// files a flush writes), fsync for the plain file, both timed.

const (
	benchBlock = 1 << 20
	// benchReadBlocks is the working set of the read benchmarks: 4× the
	// default block cache, so that round-robin reads miss Pebble's cache.
	// Both the tier's files and the plain file were just written and are in
	// the kernel's page cache as far as memory allows.
	benchReadBlocks = 4 * DefaultCacheSize / benchBlock
	benchValues     = 16 // distinct block contents
)

// benchDir returns an empty directory for one benchmark run.
func benchDir(b *testing.B) string {
	root := os.Getenv("KVSTRATA_BENCH_DIR")
	if root == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(root, "kvstrata-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// benchBlocks returns n random blocks and their checksums.
func benchBlocks(n int) ([][]byte, []uint64) {
	r := rand.New(rand.NewPCG(1, 2))
	vals, sums := make([][]byte, n), make([]uint64, n)
	for i := range vals {
		vals[i] = make([]byte, benchBlock)
		for j := 0; j < benchBlock; j += 8 {
			v := r.Uint64()
			for k := range 8 {
				vals[i][j+k] = byte(v >> (8 * k))
			}
		}
		sums[i] = index.Checksum(vals[i])
	}
	return vals, sums
}

// benchMeta is the Header of the i-th benchmark block: a random-looking hash,
// as real chained hashes are.
func benchMeta(i int, sum uint64) index.Header {
	h := uint64(i)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	h ^= h >> 31
	m := index.Header{Key: index.Key{NS: 7, Hash: index.Hash(h)}, Sum: sum}
	m.Size = benchBlock
	return m
}

func openBench(b *testing.B, d Durability) *Tier {
	tr, err := Open(Config{
		Dir:        benchDir(b),
		Capacity:   1 << 50,
		Durability: d,
		Logger:     testLogger(b),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tr.Close() })
	return tr
}

func BenchmarkPut1MiB(b *testing.B) {
	vals, sums := benchBlocks(benchValues)
	for _, d := range []Durability{DurabilityFlush, DurabilityWAL} {
		b.Run("durability="+d.String(), func(b *testing.B) {
			tr := openBench(b, d)
			b.SetBytes(benchBlock)
			b.ResetTimer()
			for i := range b.N {
				if err := tr.Put(benchMeta(i, sums[i%benchValues]), vals[i%benchValues]); err != nil {
					b.Fatal(err)
				}
			}
			if err := tr.Flush(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			ws := tr.WriteStats()
			b.ReportMetric(ws.WriteAmp(), "write-amp")
			b.ReportMetric(ws.PebbleWriteAmp, "pebble-write-amp")
		})
	}
}

func BenchmarkPlainFileWrite1MiB(b *testing.B) {
	vals, _ := benchBlocks(benchValues)
	f, err := os.Create(filepath.Join(benchDir(b), "plain"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.Write(vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkGet1MiB(b *testing.B) {
	vals, sums := benchBlocks(benchValues)
	tr := openBench(b, DurabilityFlush)
	for i := range benchReadBlocks {
		if err := tr.Put(benchMeta(i, sums[i%benchValues]), vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	// Reopen, so that the reads start with an empty block cache and find
	// the blocks in blob files rather than in a memtable.
	tr = reopen(b, tr)
	buf := make([]byte, 0, benchBlock)
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for i := range b.N {
		j := i % benchReadBlocks
		got, _, err := tr.Get(benchMeta(j, sums[j%benchValues]).Key, buf[:0])
		if err != nil {
			b.Fatal(err)
		}
		buf = got
	}
}

func BenchmarkPlainFileRead1MiB(b *testing.B) {
	vals, _ := benchBlocks(benchValues)
	f, err := os.Create(filepath.Join(benchDir(b), "plain"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for i := range benchReadBlocks {
		if _, err := f.Write(vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, benchBlock)
	b.SetBytes(benchBlock)
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.ReadAt(buf, int64(i%benchReadBlocks)*benchBlock); err != nil {
			b.Fatal(err)
		}
	}
}

// dropCache asks the kernel to forget the cached pages of every file under
// dir, so that the next reads come from the disk: the cold case the SSD
// tier exists for (what is hot lives in the DRAM tier above it).
func dropCache(b *testing.B, dir string) {
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return nil // a file Pebble just removed
		}
		defer f.Close()
		_ = f.Sync()
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// The cold benchmarks read every block once from the disk per pass, the
// tier's and the plain file's pages dropped from the page cache before
// each pass (outside the timing). They report the CPU time the process
// spent per block while timed (cpu-ns/op): on a machine shared with other
// work, CPU per block is steadier than time per block, and it is what
// a busy node runs short of.
type coldPasses struct {
	b        *testing.B
	dir      string
	cpu      time.Duration
	cpuStart time.Duration
}

// startCold starts the timing of the cold passes over dir's files.
func startCold(b *testing.B, dir string) *coldPasses {
	c := &coldPasses{b: b, dir: dir}
	b.ResetTimer()
	c.cpuStart = processCPU(b)
	return c
}

// drop drops dir's files from the page cache, outside the timing.
func (c *coldPasses) drop() {
	c.b.StopTimer()
	c.cpu += processCPU(c.b) - c.cpuStart
	dropCache(c.b, c.dir)
	c.cpuStart = processCPU(c.b)
	c.b.StartTimer()
}

// stop ends the timing and reports the CPU time per block.
func (c *coldPasses) stop() {
	c.b.StopTimer()
	c.cpu += processCPU(c.b) - c.cpuStart
	c.b.ReportMetric(float64(c.cpu.Nanoseconds())/float64(c.b.N), "cpu-ns/op")
}

// processCPU is the user and system CPU time the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkGetCold1MiB(b *testing.B) {
	vals, sums := benchBlocks(benchValues)
	tr := openBench(b, DurabilityFlush)
	for i := range benchReadBlocks {
		if err := tr.Put(benchMeta(i, sums[i%benchValues]), vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	tr = reopen(b, tr)
	buf := make([]byte, 0, benchBlock)
	b.SetBytes(benchBlock)
	cold := startCold(b, tr.cfg.Dir)
	for i := range b.N {
		j := i % benchReadBlocks
		if j == 0 {
			cold.drop()
		}
		got, _, err := tr.Get(benchMeta(j, sums[j%benchValues]).Key, buf[:0])
		if err != nil {
			b.Fatal(err)
		}
		buf = got
	}
	cold.stop()
}

// benchChain is the length of the chains BenchmarkChainCold1MiB reads: a
// 64 MiB context of 1 MiB blocks.
const benchChain = 64

// BenchmarkChainCold1MiB restores chains of benchChain blocks from the
// disk: each chain with one GetManyPooled, or GetMany, where the tier has
// it (the hierarchy's ReadManyPooled, which a node's get of a context
// uses, reads a level so), else
// with one Get after another, as ReadMany does then. The blocks of a chain
// are wherever their random hashes put them in the blob files.
func BenchmarkChainCold1MiB(b *testing.B) {
	vals, sums := benchBlocks(benchValues)
	tr := openBench(b, DurabilityFlush)
	for i := range benchReadBlocks {
		if err := tr.Put(benchMeta(i, sums[i%benchValues]), vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	tr = reopen(b, tr)
	tr.bufs.NoPoison() // as a server reads: the poison is for tests
	keys := make([]index.Key, benchReadBlocks)
	for i := range keys {
		keys[i] = benchMeta(i, sums[i%benchValues]).Key
	}
	mg, batched := any(tr).(tiers.ManyGetter)
	pg, pooled := any(tr).(tiers.PooledManyGetter)
	b.ReportMetric(map[bool]float64{false: 0, true: 1}[batched], "batched")
	b.SetBytes(benchBlock)
	cold := startCold(b, tr.cfg.Dir)
	for i := 0; i < b.N; i += benchChain {
		j := i % benchReadBlocks
		if j == 0 {
			cold.drop()
		}
		chain := keys[j:min(j+benchChain, j+b.N-i)]
		if !batched {
			for _, k := range chain {
				if _, _, err := tr.Get(k, nil); err != nil {
					b.Fatal(err)
				}
			}
			continue
		}
		var failed error
		var err error
		if pooled { // as the hierarchy's ReadManyPooled reads a level
			err = pg.GetManyPooled(context.Background(), chain, func(_ int, _ []byte, ref *bufpool.Buffer, _ index.Header, err error) {
				ref.Release()
				if err != nil {
					failed = err
				}
			})
		} else {
			err = mg.GetMany(context.Background(), chain, func(_ int, _ []byte, _ index.Header, err error) {
				if err != nil {
					failed = err
				}
			})
		}
		if err != nil || failed != nil {
			b.Fatal(err, failed)
		}
	}
	cold.stop()
}

func BenchmarkPlainFileReadCold1MiB(b *testing.B) {
	vals, _ := benchBlocks(benchValues)
	dir := benchDir(b)
	f, err := os.Create(filepath.Join(dir, "plain"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for i := range benchReadBlocks {
		if _, err := f.Write(vals[i%benchValues]); err != nil {
			b.Fatal(err)
		}
	}
	buf := make([]byte, benchBlock)
	b.SetBytes(benchBlock)
	cold := startCold(b, dir)
	for i := range b.N {
		j := i % benchReadBlocks
		if j == 0 {
			cold.drop()
		}
		if _, err := f.ReadAt(buf, int64(j)*benchBlock); err != nil {
			b.Fatal(err)
		}
	}
	cold.stop()
}

// BenchmarkTier is the benchmark every backend runs (tiertest.Bench), on
// a tier of the default durability in a temporary directory.
func BenchmarkTier(b *testing.B) { tiertest.Bench(b, factory(DurabilityFlush)) }

// BenchmarkGetColdBySize reads blocks of several sizes from the disk, kept
// inline in Pebble or in block files, to place Config.FileMinSize: where a
// file of its own starts to read faster than an inline value. Each pass
// reads 1024 blocks, with every file's pages dropped before it.
func BenchmarkGetColdBySize(b *testing.B) {
	const blocks = 1024
	for _, size := range []int{16 << 10, 64 << 10, 256 << 10} {
		for _, where := range []string{"inline", "file"} {
			b.Run(fmt.Sprintf("size=%dKiB/%s", size>>10, where), func(b *testing.B) {
				fileMin := int64(size)
				if where == "inline" {
					fileMin = int64(size) + 1
				}
				tr, err := Open(Config{Dir: benchDir(b), Capacity: 1 << 50, FileMinSize: fileMin, Logger: testLogger(b)})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = tr.Close() })
				keys := make([]index.Key, blocks)
				for i := range keys {
					m, v := tiertest.Block(index.Hash(i+1), size)
					must(b, tr.Put(m, v))
					keys[i] = m.Key
				}
				tr = reopen(b, tr)
				r := rand.New(rand.NewPCG(3, 4))
				r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
				buf := make([]byte, 0, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					if i%blocks == 0 {
						b.StopTimer()
						dropCache(b, tr.cfg.Dir)
						b.StartTimer()
					}
					got, _, err := tr.Get(keys[i%blocks], buf[:0])
					if err != nil {
						b.Fatal(err)
					}
					buf = got
				}
			})
		}
	}
}

// BenchmarkGetHit64KiB reads 64 KiB blocks kept in block files, at random
// among 4096 (256 MiB), their pages in the page cache: the SSD hits of a
// node under mixed load, where the blocks were demoted lately. It reports
// the CPU time per block (cpu-ns/op): the system calls of each hit, the
// copy and the checksum. It runs with the files kept open (the default
// OpenFiles holds all of them) and with none kept open.
func BenchmarkGetHit64KiB(b *testing.B) {
	const size, blocks = 64 << 10, 4096
	for _, open := range []int{DefaultOpenFiles, -1} {
		b.Run(fmt.Sprintf("openfiles=%d", open), func(b *testing.B) {
			tr, err := Open(Config{Dir: benchDir(b), Capacity: 1 << 50, OpenFiles: open, Logger: testLogger(b)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tr.Close() })
			keys := make([]index.Key, blocks)
			for i := range keys {
				m, v := tiertest.Block(index.Hash(i+1), size)
				must(b, tr.Put(m, v))
				keys[i] = m.Key
			}
			must(b, tr.Flush())
			r := rand.New(rand.NewPCG(5, 6))
			buf := make([]byte, 0, size)
			b.SetBytes(size)
			b.ResetTimer()
			start := processCPU(b)
			for range b.N {
				got, _, err := tr.Get(keys[r.IntN(blocks)], buf[:0])
				if err != nil {
					b.Fatal(err)
				}
				buf = got
			}
			b.StopTimer()
			b.ReportMetric(float64((processCPU(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

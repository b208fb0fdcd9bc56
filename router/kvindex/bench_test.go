package kvindex

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/index"
)

// The routing benchmarks' world: 64 workers of one namespace (16-token
// blocks) and 1 M indexed blocks, as conversations of 512 blocks in groups
// of 8 that share their first 128 (a system prompt and a document); each
// conversation is in the pools of 2 workers, so there are about 2.4 M
// (block, worker) entries. A query is a conversation's first L−16 blocks
// and 16 blocks no one holds (the new turn): the walk goes deep.
const (
	benchWorkers  = 64
	benchBT       = 16
	benchConvLen  = 512
	benchShared   = 128
	benchPerGroup = 8
	benchGroups   = 1 << 20 / (benchShared + benchPerGroup*(benchConvLen-benchShared))
)

type benchWorld struct {
	x     *Index
	ns    index.Namespace
	convs [][]index.Hash // each conversation's chain
}

var (
	worldOnce sync.Once
	world     *benchWorld
)

func getWorld(b *testing.B) *benchWorld {
	worldOnce.Do(func() { world = buildWorld(b, benchWorkers, 2) })
	return world
}

// buildWorld indexes benchGroups groups of conversations, each held by
// holders of nw workers.
func buildWorld(tb testing.TB, nw, holders int) *benchWorld {
	ns := testNS("bench", benchBT)
	x := newIndex(tb, &Config{MaxEntries: 64 << 20})
	for w := range nw {
		register(tb, x, WorkerID(w), ns)
	}
	r := rand.New(rand.NewPCG(7, 7))
	toks := func(n int) []int64 {
		out := make([]int64, n*benchBT)
		for i := range out {
			out[i] = int64(r.IntN(100000))
		}
		return out
	}
	gpuMedium := kvevents.MediumGPU
	// event stores n blocks after parent (nil: none), named by their
	// kvstrata hashes, which it appends to chain.
	event := func(parent *kvevents.Hash, tokens []int64, chain []index.Hash) (*kvevents.BlockStored, []index.Hash) {
		e := &kvevents.BlockStored{ParentBlockHash: parent, TokenIDs: tokens, BlockSize: benchBT, Medium: &gpuMedium}
		prev := ns.Seed()
		if len(chain) > 0 {
			prev = uint64(chain[len(chain)-1])
		}
		t32 := make([]uint32, benchBT)
		for i := 0; i < len(tokens)/benchBT; i++ {
			for j := range t32 {
				t32[j] = uint32(tokens[i*benchBT+j])
			}
			h := index.ChainHash(prev, t32)
			prev = uint64(h)
			chain = append(chain, h)
			e.BlockHashes = append(e.BlockHashes, kvevents.UintHash(uint64(h)))
		}
		return e, chain
	}
	wd := &benchWorld{x: x, ns: ns}
	for range benchGroups {
		prefixEv, prefix := event(nil, toks(benchShared), nil)
		last := kvevents.UintHash(uint64(prefix[len(prefix)-1]))
		for range benchPerGroup {
			convEv, chain := event(&last, toks(benchConvLen-benchShared), slices.Clone(prefix))
			wd.convs = append(wd.convs, chain)
			for range holders {
				w := WorkerID(r.IntN(nw))
				apply(tb, x, w, prefixEv, convEv)
			}
		}
	}
	return wd
}

// query is the chain of conversation c cut to l blocks, the last 16 new.
func (wd *benchWorld) query(r *rand.Rand, l int) []index.Hash {
	c := wd.convs[r.IntN(len(wd.convs))]
	q := slices.Clone(c[:l-16])
	for range 16 {
		q = append(q, index.Hash(r.Uint64()))
	}
	return q
}

func (wd *benchWorld) queries(l int) [][]index.Hash {
	r := rand.New(rand.NewPCG(uint64(l), 1))
	qs := make([][]index.Hash, 4096)
	for i := range qs {
		qs[i] = wd.query(r, l)
	}
	return qs
}

// BenchmarkOverlap is one routing goroutine's queries: queries/s and the
// p99 of one query's latency, by chain length.
func BenchmarkOverlap(b *testing.B) {
	wd := getWorld(b)
	for _, l := range []int{64, 256, 512} {
		b.Run("blocks="+itoa(l), func(b *testing.B) {
			qs := wd.queries(l)
			lat := make([]time.Duration, 0, b.N)
			var ms []Match
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ResetTimer()
			cpu0 := threadCPU()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				ms = wd.x.Overlap(wd.ns.ID(), qs[i%len(qs)], ms[:0])
				lat = append(lat, time.Since(t0))
			}
			el := time.Since(start)
			cpu := threadCPU() - cpu0
			b.StopTimer()
			reportLatency(b, lat, el)
			b.ReportMetric(float64(b.N)/cpu.Seconds(), "queries/cpu-s")
		})
	}
}

// BenchmarkOverlapParallel is GOMAXPROCS routing goroutines querying at
// once, alone and while 8 workers' events are applied (stores and
// removals of fresh blocks, as fast as they go): queries/s in all.
func BenchmarkOverlapParallel(b *testing.B) {
	wd := getWorld(b)
	for _, writers := range []int{0, 8} {
		b.Run("writers="+itoa(writers), func(b *testing.B) {
			qs := wd.queries(256)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var applied atomic.Int64
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					churn(wd, WorkerID(w), stop, &applied)
				}()
			}
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				var ms []Match
				for pb.Next() {
					ms = wd.x.Overlap(wd.ns.ID(), qs[next.Add(1)%int64(len(qs))], ms[:0])
				}
			})
			el := time.Since(start)
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(b.N)/el.Seconds(), "queries/s")
			b.ReportMetric(float64(applied.Load())/el.Seconds(), "applied-blocks/s")
		})
	}
}

// churn stores and removes chains of 16 fresh blocks for worker w until
// stop, counting the blocks applied.
func churn(wd *benchWorld, w WorkerID, stop chan struct{}, applied *atomic.Int64) {
	gpuMedium := kvevents.MediumGPU
	tokens := make([]int64, 16*benchBT)
	for i := range tokens {
		tokens[i] = int64(i + int(w)*1000)
	}
	base := uint64(w+1) << 48
	for n := uint64(0); ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		ids := make([]kvevents.Hash, 16)
		for i := range ids {
			ids[i] = kvevents.UintHash(base + n*16 + uint64(i))
		}
		st := &kvevents.BlockStored{BlockHashes: ids, TokenIDs: tokens, BlockSize: benchBT, Medium: &gpuMedium}
		tokens[0]++ // other content each time
		_ = wd.x.Apply(w, &kvevents.Batch{Events: []kvevents.Event{st}})
		_ = wd.x.Apply(w, &kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockRemoved{BlockHashes: ids, Medium: &gpuMedium}}})
		applied.Add(32)
	}
}

// BenchmarkApply is ingestion: batches of one BlockStored of 16 fresh
// blocks (16 tokens each), each chained to the one before, spread over 64
// workers, into an index capped at 1 M entries (so that it prunes as it
// goes, as a full index does): block events/s.
func BenchmarkApply(b *testing.B) {
	ns := testNS("bench", benchBT)
	x := newIndex(b, &Config{MaxEntries: 1 << 20})
	const nw = 64
	for w := range nw {
		register(b, x, WorkerID(w), ns)
	}
	gpuMedium := kvevents.MediumGPU
	tokens := make([]int64, 16*benchBT)
	for i := range tokens {
		tokens[i] = int64(i)
	}
	type state struct {
		last *kvevents.Hash
		n    uint64
	}
	st := make([]state, nw)
	batches := make([]*kvevents.Batch, nw)
	for w := range batches {
		batches[w] = &kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
			BlockHashes: make([]kvevents.Hash, 16), TokenIDs: tokens, BlockSize: benchBT, Medium: &gpuMedium}}}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := threadCPU()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		w := i % nw
		s := &st[w]
		e := batches[w].Events[0].(*kvevents.BlockStored)
		for j := range e.BlockHashes {
			s.n++
			e.BlockHashes[j] = kvevents.UintHash(uint64(w)<<48 | s.n)
		}
		e.ParentBlockHash = s.last
		if err := x.Apply(WorkerID(w), batches[w]); err != nil {
			b.Fatal(err)
		}
		last := e.BlockHashes[15]
		s.last = &last
		if s.n%4096 == 0 { // a new conversation now and then
			s.last = nil
		}
	}
	el := time.Since(start)
	cpu := threadCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N*16)/el.Seconds(), "blocks/s")
	b.ReportMetric(float64(b.N*16)/cpu.Seconds(), "blocks/cpu-s")
	if st := x.Stats(); st.Orphans != 0 {
		b.Fatalf("stats %+v: no block should be an orphan", st)
	}
}

// BenchmarkBytesPerBlock measures the heap an indexed block costs: the
// benchmark world (1 M blocks, 64 workers, each conversation held by 1 or
// by 2 workers), heap in use after a GC before and after building it.
func BenchmarkBytesPerBlock(b *testing.B) {
	for _, holders := range []int{1, 2} {
		b.Run("holders="+itoa(holders), func(b *testing.B) {
			for range b.N {
				before := heap()
				wd := buildWorld(b, benchWorkers, holders)
				convs := len(wd.convs) * len(wd.convs[0]) * 8 // the benchmark's own chains
				after := heap()
				s := wd.x.Stats()
				used := float64(after - before - uint64(convs))
				b.ReportMetric(used/float64(s.Blocks), "bytes/block")
				b.ReportMetric(used/float64(s.Entries), "bytes/entry")
				b.ReportMetric(float64(s.Blocks), "blocks")
				runtime.KeepAlive(wd)
			}
		})
	}
}

// threadCPU is the CPU time the calling thread has used (Linux's
// RUSAGE_THREAD): on a machine shared with other work, a single-goroutine
// benchmark locked to its thread divides by it to measure what one core
// does, whatever the wall clock lost to other processes. It leaves out the
// garbage collector's background threads.
func threadCPU() time.Duration {
	const rusageThread = 1
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func reportLatency(b *testing.B, lat []time.Duration, el time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/el.Seconds(), "queries/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// BenchmarkMapFloor is the floor under BenchmarkOverlap: the same queries
// as bare lookups of every hash in a map of the world's blocks, with
// nothing else done; per block, against BenchmarkOverlap's ns/op divided
// by the chain length.
func BenchmarkMapFloor(b *testing.B) {
	wd := getWorld(b)
	m := make(map[index.Hash]uint32, len(wd.convs)*benchConvLen)
	for i, c := range wd.convs {
		for _, h := range c {
			m[h] = uint32(i)
		}
	}
	qs := wd.queries(512)
	b.ResetTimer()
	var sink uint32
	for i := 0; i < b.N; i++ {
		for _, h := range qs[i%len(qs)] {
			sink += m[h]
		}
	}
	runtime.KeepAlive(sink)
}

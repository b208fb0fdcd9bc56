package kvindex

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/index"
)

// prompt returns n tokens: the first shared tokens from a common system
// prompt, the rest drawn from r.
func prompt(r *rand.Rand, shared, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		if i < shared {
			out[i] = uint32(i*7 + 1)
		} else {
			out[i] = r.Uint32N(50000)
		}
	}
	return out
}

// A worker's pool stores and evicts blocks as requests come and go; after
// every step, the index's overlap for each prompt seen equals what the
// pool itself would match — for a worker publishing integer hashes and one
// publishing sha256-style byte strings.
func TestOverlapEqualsPoolMatch(t *testing.T) {
	ns := testNS("m", 4)
	x := newIndex(t, nil)
	workers := []*poolWorker{newPoolWorker(t, ns, 40, intForm), newPoolWorker(t, ns, 64, sha256Form)}
	for i := range workers {
		register(t, x, WorkerID(i+1), ns)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var prompts [][]uint32
	for step := range 300 {
		p := prompt(r, r.IntN(24), 4+r.IntN(40))
		if step > 0 && r.IntN(3) == 0 { // a conversation: a prompt seen before, grown
			old := prompts[r.IntN(len(prompts))]
			p = append(append([]uint32(nil), old...), p[:r.IntN(min(12, len(p)))]...)
		}
		prompts = append(prompts, p)
		w := r.IntN(len(workers))
		if b := workers[w].serve(t, p); b != nil {
			if err := x.Apply(WorkerID(w+1), b); err != nil {
				t.Fatal(err)
			}
		}
		for _, q := range prompts {
			hashes := ns.Hashes(q)
			ms := x.Overlap(ns.ID(), hashes, nil)
			for i, pw := range workers {
				if got, want := overlapOf(t, ms, WorkerID(i+1)), pw.p.Match(ns.ID(), hashes); got != want {
					t.Fatalf("step %d: worker %d: overlap %d, pool matches %d", step, i+1, got, want)
				}
			}
		}
	}
	if s := x.Stats(); s.Orphans != 0 || s.Refused != 0 || s.Pruned != 0 {
		t.Fatalf("stats %+v: nothing should be orphaned, refused or pruned", s)
	}
}

// Two engines that name the same blocks differently (Python hash ints,
// sha256 byte strings) index them under the same kvstrata keys: both match
// a request hashed by the router, and each other.
func TestHashFormsGiveSameKeys(t *testing.T) {
	ns := testNS("m", 2)
	x := newIndex(t, nil)
	register(t, x, 1, ns)
	register(t, x, 2, ns)
	toks := []uint32{1, 2, 3, 4, 5, 6}
	one := uint64(11)
	apply(t, x, 1, stored(intForm, nil, []uint64{11}, toks[:2], 2), stored(intForm, &one, []uint64{12, 13}, toks[2:], 2))
	// The other engine's names have nothing in common with the first's.
	apply(t, x, 2, stored(sha256Form, nil, []uint64{901, 902, 903}, toks, 2))
	ms := x.Overlap(ns.ID(), ns.Hashes(toks), nil)
	if overlapOf(t, ms, 1) != 3 || overlapOf(t, ms, 2) != 3 {
		t.Fatalf("overlap %v, want both workers at 3 blocks", ms)
	}
	if s := x.Stats(); s.Blocks != 3 || s.Entries != 6 {
		t.Fatalf("stats %+v: want 3 blocks held by 2 workers each", s)
	}
	// Removal by each engine's own names.
	apply(t, x, 2, removed(sha256Form, 902))
	ms = x.Overlap(ns.ID(), ns.Hashes(toks), nil)
	if overlapOf(t, ms, 1) != 3 || overlapOf(t, ms, 2) != 1 {
		t.Fatalf("after worker 2 removed its second block: %v", ms)
	}
}

// A negative Python hash and its 64-bit two's complement are one name; a
// byte string shorter than 8 bytes is read as a number.
func TestEngineKey(t *testing.T) {
	for _, c := range []struct {
		h    kvevents.Hash
		want uint64
	}{
		{kvevents.IntHash(-1), 1<<64 - 1},
		{kvevents.UintHash(1<<64 - 1), 1<<64 - 1},
		{kvevents.IntHash(42), 42},
		{kvevents.BytesHash([]byte{1, 2}), 0x0102},
		{kvevents.BytesHash([]byte{9, 9, 1, 2, 3, 4, 5, 6, 7, 8}), 0x0102030405060708},
	} {
		if got := engineKey(c.h); got != c.want {
			t.Errorf("engineKey(%v) = %#x, want %#x", c.h, got, c.want)
		}
	}
}

// Removal, clear and the worker's reset (ClearWorker) forget exactly that
// worker's blocks; RemoveWorker forgets the worker.
func TestRemoveAndClear(t *testing.T) {
	ns := testNS("m", 2)
	x := newIndex(t, nil)
	for w := WorkerID(1); w <= 3; w++ {
		register(t, x, w, ns)
		apply(t, x, w, stored(intForm, nil, []uint64{1, 2, 3}, []uint32{1, 2, 3, 4, 5, 6}, 2))
	}
	q := ns.Hashes([]uint32{1, 2, 3, 4, 5, 6})
	apply(t, x, 1, removed(intForm, 3, 77)) // 77: not known, ignored
	apply(t, x, 2, &kvevents.AllBlocksCleared{})
	ms := x.Overlap(ns.ID(), q, nil)
	if overlapOf(t, ms, 1) != 2 || overlapOf(t, ms, 2) != 0 || overlapOf(t, ms, 3) != 3 {
		t.Fatalf("overlap %v: want 1→2, 2→0, 3→3", ms)
	}
	if err := x.ClearWorker(3); err != nil {
		t.Fatal(err)
	}
	if err := x.RemoveWorker(1); err != nil {
		t.Fatal(err)
	}
	if ms := x.Overlap(ns.ID(), q, nil); len(ms) != 0 {
		t.Fatalf("overlap %v after clearing 3 and removing 1, want none", ms)
	}
	if s := x.Stats(); s.Blocks != 0 || s.Entries != 0 || s.Workers != 2 {
		t.Fatalf("stats %+v: want 2 workers and nothing indexed", s)
	}
	if err := x.Apply(1, &kvevents.Batch{}); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("Apply of a removed worker: %v, want ErrUnknownWorker", err)
	}
	// A worker registered again starts from nothing, though it reuses the
	// removed one's bit.
	register(t, x, 9, ns)
	if ms := x.Overlap(ns.ID(), q, nil); len(ms) != 0 {
		t.Fatalf("overlap %v for a new worker, want none", ms)
	}
	if err := x.Register(9, ns); !errors.Is(err, ErrWorkerExists) {
		t.Fatalf("second Register: %v, want ErrWorkerExists", err)
	}
}

// A worker of another namespace (another model, or another block size)
// never matches; an event whose block size is not the worker's namespace's
// is refused and changes nothing.
func TestOtherNamespaceNeverMatches(t *testing.T) {
	a, b, c := testNS("a", 2), testNS("b", 2), testNS("a", 4)
	x := newIndex(t, nil)
	register(t, x, 1, a)
	register(t, x, 2, b)
	register(t, x, 3, c)
	toks := []uint32{1, 2, 3, 4}
	for w := WorkerID(1); w <= 2; w++ {
		apply(t, x, w, stored(intForm, nil, []uint64{1, 2}, toks, 2))
	}
	apply(t, x, 3, stored(intForm, nil, []uint64{1}, toks, 4))
	apply(t, x, 3, stored(intForm, nil, []uint64{5, 6}, toks, 2)) // not its block size
	if s := x.Stats(); s.Refused != 1 {
		t.Fatalf("refused %d, want 1", s.Refused)
	}
	for _, ns := range []index.Namespace{a, b, c} {
		ms := x.Overlap(ns.ID(), ns.Hashes(toks), nil)
		if len(ms) != 1 {
			t.Fatalf("namespace %s: overlap %v, want its own worker only", ns.Model, ms)
		}
	}
	// The hashes of a under b's namespace match nobody.
	if ms := x.Overlap(b.ID(), a.Hashes(toks), nil); len(ms) != 0 {
		t.Fatalf("a's chain in b's namespace matched %v", ms)
	}
}

// Events the index cannot use change nothing and are counted: a LoRA
// adapter's blocks, tokens that do not fill the blocks or do not fit 32
// bits, and blocks of another medium (stored or removed).
func TestRefusedAndOtherMedium(t *testing.T) {
	ns := testNS("m", 2)
	x := newIndex(t, nil)
	register(t, x, 1, ns)
	toks := []uint32{1, 2, 3, 4}
	apply(t, x, 1, stored(intForm, nil, []uint64{1, 2}, toks, 2))
	lora := stored(intForm, nil, []uint64{5}, []uint32{7, 8}, 2)
	lora.LoraID = new(int64)
	short := stored(intForm, nil, []uint64{6, 7}, []uint32{7, 8, 9}, 2)
	big := stored(intForm, nil, []uint64{8}, []uint32{7, 8}, 2)
	big.TokenIDs[1] = 1 << 40
	cpu := "CPU"
	cpuStored := stored(intForm, nil, []uint64{9}, []uint32{7, 8}, 2)
	cpuStored.Medium = &cpu
	cpuRemoved := removed(intForm, 1, 2)
	cpuRemoved.Medium = &cpu
	apply(t, x, 1, lora, short, big, cpuStored, cpuRemoved)
	s := x.Stats()
	if s.Refused != 3 || s.OtherMedium != 2 || s.Blocks != 2 || s.Entries != 2 {
		t.Fatalf("stats %+v: want 3 refused, 2 of another medium, the 2 GPU blocks kept", s)
	}
	if ms := x.Overlap(ns.ID(), ns.Hashes(toks), nil); overlapOf(t, ms, 1) != 2 {
		t.Fatalf("overlap %v, want the 2 GPU blocks", ms)
	}
}

// A BlockStored whose parent the index does not hold for that worker (its
// BlockStored was lost, or it was stored by another worker) is skipped and
// counted; blocks stored from a known parent later are indexed.
func TestOrphanSkipped(t *testing.T) {
	ns := testNS("m", 2)
	x := newIndex(t, nil)
	register(t, x, 1, ns)
	register(t, x, 2, ns)
	toks := []uint32{1, 2, 3, 4, 5, 6}
	apply(t, x, 1, stored(intForm, nil, []uint64{1}, toks[:2], 2))
	p := uint64(1)
	apply(t, x, 2, stored(intForm, &p, []uint64{2, 3}, toks[2:], 2)) // worker 2 never stored 1
	q := uint64(99)
	apply(t, x, 1, stored(intForm, &q, []uint64{4}, toks[4:], 2)) // a gap: 99 was never heard
	if s := x.Stats(); s.Orphans != 3 || s.Entries != 1 {
		t.Fatalf("stats %+v: want 3 orphan blocks and worker 1's first block only", s)
	}
	apply(t, x, 1, stored(intForm, &p, []uint64{2, 3}, toks[2:], 2))
	ms := x.Overlap(ns.ID(), ns.Hashes(toks), nil)
	if overlapOf(t, ms, 1) != 3 || overlapOf(t, ms, 2) != 0 {
		t.Fatalf("overlap %v, want worker 1 at 3, worker 2 at none", ms)
	}
}

// An engine that names one kvstrata block twice (its hash covers what
// kvstrata's ignores, e.g. a cache salt) keeps it until both names are
// removed.
func TestTwoNamesOneBlock(t *testing.T) {
	ns := testNS("m", 2)
	x := newIndex(t, nil)
	register(t, x, 1, ns)
	toks := []uint32{1, 2}
	apply(t, x, 1, stored(intForm, nil, []uint64{1}, toks, 2), stored(intForm, nil, []uint64{2}, toks, 2))
	apply(t, x, 1, removed(intForm, 1))
	if ms := x.Overlap(ns.ID(), ns.Hashes(toks), nil); overlapOf(t, ms, 1) != 1 {
		t.Fatalf("overlap %v after one of two names was removed, want 1", ms)
	}
	apply(t, x, 1, removed(intForm, 2))
	if s := x.Stats(); s.Entries != 0 || s.Blocks != 0 {
		t.Fatalf("stats %+v after both names were removed, want nothing", s)
	}
}

// Under a small cap, a stream of prompts never leaves more entries than
// the cap, pruning counts what it dropped, and every overlap is at most
// what the pool holds (pruning only forgets).
func TestPruneBoundsEntriesAndNeverOverstates(t *testing.T) {
	ns := testNS("m", 4)
	const limit = 64
	x := newIndex(t, &Config{MaxEntries: limit})
	workers := []*poolWorker{newPoolWorker(t, ns, 60, intForm), newPoolWorker(t, ns, 60, sha256Form)}
	for i := range workers {
		register(t, x, WorkerID(i+1), ns)
	}
	r := rand.New(rand.NewPCG(3, 4))
	hot := prompt(r, 32, 32)
	for step := range 400 {
		p := prompt(r, r.IntN(16), 8+r.IntN(40))
		w := r.IntN(len(workers))
		for _, toks := range [][]uint32{hot, p} {
			if b := workers[w].serve(t, toks); b != nil {
				if err := x.Apply(WorkerID(w+1), b); err != nil {
					t.Fatal(err)
				}
			}
		}
		if s := x.Stats(); s.Entries > limit {
			t.Fatalf("step %d: %d entries, cap %d", step, s.Entries, limit)
		}
		for _, toks := range [][]uint32{hot, p} {
			hashes := ns.Hashes(toks)
			ms := x.Overlap(ns.ID(), hashes, nil)
			for i, pw := range workers {
				if got, held := overlapOf(t, ms, WorkerID(i+1)), pw.p.Match(ns.ID(), hashes); got > held {
					t.Fatalf("step %d: worker %d: overlap %d, the pool holds %d", step, i+1, got, held)
				}
			}
		}
	}
	s := x.Stats()
	if s.Pruned == 0 {
		t.Fatalf("stats %+v: the cap should have pruned", s)
	}
}

// Apply from one goroutine per worker and Overlap from many at once: run
// under -race, every answer is within what was ever stored.
func TestConcurrentApplyAndOverlap(t *testing.T) {
	ns := testNS("m", 4)
	x := newIndex(t, &Config{MaxEntries: 2000})
	const nw = 4
	var wg sync.WaitGroup
	done := make(chan struct{})
	shared := prompt(rand.New(rand.NewPCG(9, 9)), 64, 64)
	hashes := ns.Hashes(shared)
	for w := range nw {
		register(t, x, WorkerID(w), ns)
		pw := newPoolWorker(t, ns, 100, intForm)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 200 {
				toks := append(append([]uint32(nil), shared[:4*r.IntN(16)]...), prompt(r, 0, 4+r.IntN(20))...)
				if b := pw.serve(t, toks); b != nil {
					if err := x.Apply(WorkerID(w), b); err != nil {
						t.Error(err)
						return
					}
				}
			}
			if w == 0 {
				_ = x.ClearWorker(0)
			}
		}()
	}
	var readers sync.WaitGroup
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var ms []Match
			for {
				select {
				case <-done:
					return
				default:
				}
				ms = x.Overlap(ns.ID(), hashes, ms[:0])
				for _, m := range ms {
					if m.Blocks < 1 || m.Blocks > len(hashes) || m.Worker >= nw {
						t.Errorf("bad match %+v", m)
						return
					}
				}
				_ = x.Stats()
			}
		}()
	}
	wg.Wait()
	close(done)
	readers.Wait()
}

package policy

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// policies lists every policy with a factory; each runs the common suite.
var policies = []struct {
	name string
	new  func() Policy
}{
	{"lru", func() Policy { return NewLRU() }},
	{"lfu", func() Policy { return NewLFU() }},
	{"prefix", func() Policy { return NewPrefix() }},
	{"s3fifo", func() Policy { return NewS3FIFO() }},
	{"wtinylfu", func() Policy { return NewWTinyLFU() }},
	{"s3fifo-prefix", func() Policy { return NewS3FIFOPrefix() }},
	{"wtinylfu-prefix", func() Policy { return NewWTinyLFUPrefix() }},
	{"arc", func() Policy { return NewARC() }},
	{"arc-prefix", func() Policy { return NewARCPrefix() }},
	{"lhd", func() Policy { return NewLHD() }},
	{"belady", func() Policy { return NewBelady(newRandomOracle(1)) }},
}

func TestPolicies(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) { testCommonPolicy(t, pc.new) })
	}
}

// testCommonPolicy is the behaviour every Policy shares, whatever order it
// evicts in.
func testCommonPolicy(t *testing.T, newPolicy func() Policy) {
	t.Run("an empty policy holds nothing and has no victim", func(t *testing.T) {
		p := newPolicy()
		if p.Len() != 0 {
			t.Fatalf("Len = %d, want 0", p.Len())
		}
		if k, ok := p.Victim(nil); ok {
			t.Fatalf("Victim on empty = %v, want none", k)
		}
		if p.Touch(key(1)) {
			t.Fatal("Touch of an absent key reported it held")
		}
		p.Remove(key(1))
		if p.Len() != 0 {
			t.Fatalf("Len after removing an absent key = %d, want 0", p.Len())
		}
	})

	t.Run("Add, Touch, Remove and Len agree on what is held", func(t *testing.T) {
		p := newPolicy()
		for i := range 5 {
			p.Add(entry(i))
		}
		p.Add(entry(2)) // again: an access, not a second block
		wantLen(t, p, 5)
		if !p.Touch(key(3)) {
			t.Fatal("Touch of a held key reported it absent")
		}
		if p.Touch(key(9)) {
			t.Fatal("Touch of a never-added key reported it held")
		}
		p.Remove(key(3))
		wantLen(t, p, 4)
		if p.Touch(key(3)) {
			t.Fatal("Touch of a removed key reported it held")
		}
		p.Remove(key(3))
		p.Remove(key(9))
		wantLen(t, p, 4)
		p.Add(entry(3))
		wantLen(t, p, 5)
	})

	t.Run("Victim names a held block and leaves it held", func(t *testing.T) {
		p := newPolicy()
		for i := range 5 {
			p.Add(entry(i))
		}
		v, ok := p.Victim(nil)
		if !ok || v.Hash >= 5 {
			t.Fatalf("Victim = %v, %v; want one of the 5 held keys", v, ok)
		}
		wantLen(t, p, 5)
		if again, _ := p.Victim(nil); again != v {
			t.Fatalf("second Victim = %v, first was %v; nothing changed between", again, v)
		}
	})

	t.Run("Victim never returns a skipped key", func(t *testing.T) {
		p := newPolicy()
		for i := range 10 {
			p.Add(entry(i))
		}
		if v, ok := p.Victim(func(k index.Key) bool { return k != key(7) }); !ok || v != key(7) {
			t.Fatalf("Victim skipping all but 7 = %v, %v; want 7", v, ok)
		}
		if v, ok := p.Victim(func(index.Key) bool { return true }); ok {
			t.Fatalf("Victim skipping everything = %v, want none", v)
		}
		if v, ok := p.Victim(func(k index.Key) bool { return k.Hash%2 == 0 }); !ok || v.Hash%2 == 0 {
			t.Fatalf("Victim skipping even keys = %v, %v; want an odd key", v, ok)
		}
	})

	t.Run("removing the victim gives the next one until none is left", func(t *testing.T) {
		for _, chained := range []bool{false, true} {
			p := newPolicy()
			for i := range 20 {
				e := entry(i)
				if chained && i%5 != 0 { // four chains of five blocks
					e = child(i, i-1)
				}
				p.Add(e)
			}
			// Passing over blocks must not lose them.
			if _, ok := p.Victim(func(k index.Key) bool { return k.Hash < 19 }); !ok {
				t.Fatal("Victim skipping all but key 19 found nothing")
			}
			seen := map[index.Key]bool{}
			for p.Len() > 0 {
				v, ok := p.Victim(nil)
				if !ok {
					t.Fatalf("Victim found nothing with %d blocks held", p.Len())
				}
				if seen[v] {
					t.Fatalf("Victim returned %v again after it was removed", v)
				}
				seen[v] = true
				p.Remove(v)
			}
			if len(seen) != 20 {
				t.Fatalf("drained %d blocks, want 20", len(seen))
			}
			if v, ok := p.Victim(nil); ok {
				t.Fatalf("Victim after draining = %v, want none", v)
			}
		}
	})

	t.Run("random operations keep the invariants of a reference set", func(t *testing.T) {
		for seed := range uint64(8) {
			rng := rand.New(rand.NewPCG(seed, 99))
			p, held := newPolicy(), map[index.Key]bool{}
			for step := range 3000 {
				op := randomOp(rng, 48)
				switch op.kind {
				case opAdd:
					p.Add(op.entry)
					held[op.entry.Key] = true
				case opTouch:
					if got := p.Touch(op.entry.Key); got != held[op.entry.Key] {
						t.Fatalf("seed %d step %d: Touch(%v) = %v, want %v", seed, step, op.entry.Key, got, held[op.entry.Key])
					}
				case opRemove:
					p.Remove(op.entry.Key)
					delete(held, op.entry.Key)
				case opVictim, opEvict:
					v, ok := p.Victim(op.skip)
					anyUnskipped := false
					for k := range held {
						anyUnskipped = anyUnskipped || !skipped(op.skip, k)
					}
					if ok != anyUnskipped {
						t.Fatalf("seed %d step %d: Victim ok = %v, want %v (%d held)", seed, step, ok, anyUnskipped, len(held))
					}
					if ok && (!held[v] || skipped(op.skip, v)) {
						t.Fatalf("seed %d step %d: Victim = %v, held %v, skipped %v", seed, step, v, held[v], skipped(op.skip, v))
					}
					if ok && op.kind == opEvict {
						p.Remove(v)
						delete(held, v)
					}
				}
				if p.Len() != len(held) {
					t.Fatalf("seed %d step %d: Len = %d, want %d", seed, step, p.Len(), len(held))
				}
			}
		}
	})
}

func TestLRUEvictsLeastRecentlyUsed(t *testing.T) {
	p := NewLRU()
	for i := range 4 {
		p.Add(entry(i))
	}
	p.Touch(key(0))
	p.Add(entry(1)) // re-adding is an access too
	wantDrain(t, p, 2, 3, 0, 1)
}

func TestLFUKeepsAFrequentBlockOverARecentOnceUsedOne(t *testing.T) {
	p := NewLFU()
	p.Add(entry(1))
	p.Touch(key(1))
	p.Touch(key(1))
	p.Add(entry(2)) // more recent, but used once
	wantVictim(t, p, 2)

	lru := NewLRU()
	lru.Add(entry(1))
	lru.Touch(key(1))
	lru.Touch(key(1))
	lru.Add(entry(2))
	wantVictim(t, lru, 1) // what LFU protects against
}

func TestLFUBreaksTiesByRecency(t *testing.T) {
	p := NewLFU()
	for i := range 3 {
		p.Add(entry(i))
	}
	p.Touch(key(0))
	p.Touch(key(1))
	p.Touch(key(2))
	wantDrain(t, p, 0, 1, 2)
}

func TestLFUAgesOutAnOldHotBlock(t *testing.T) {
	const capacity, hot = 4, 1000
	p := NewLFU()
	p.Add(entry(hot))
	for range 9 {
		p.Touch(key(hot)) // K = 10
	}
	// A stream of blocks used once each; every insertion into the full
	// cache evicts a victim, and every eviction raises the cache age.
	for i := range 100 {
		if p.Len() == capacity {
			v, _ := p.Victim(nil)
			if v == key(hot) {
				if i < 10 {
					t.Fatalf("hot block went after %d insertions; it should outlive the first ones", i)
				}
				if p.Age() < 9 {
					t.Fatalf("hot block went at age %d, before newer blocks could reach its priority", p.Age())
				}
				return
			}
			p.Remove(v)
		}
		p.Add(entry(i))
	}
	t.Fatalf("hot block still held after 100 one-shot insertions (age %d): no aging", p.Age())
}

func TestLFUExplicitRemoveDoesNotAge(t *testing.T) {
	p := NewLFU()
	p.Add(entry(1))
	for range 5 {
		p.Touch(key(1))
	}
	p.Add(entry(2))
	p.Remove(key(1)) // not the victim: a delete, not an eviction
	if p.Age() != 0 {
		t.Fatalf("Age after deleting a non-victim = %d, want 0", p.Age())
	}
	v, _ := p.Victim(nil)
	p.Remove(v)
	if p.Age() != 1 {
		t.Fatalf("Age after evicting a once-used block = %d, want 1", p.Age())
	}
}

func TestPrefixEvictsTheLeafOfAChainBeforeItsRoot(t *testing.T) {
	// A chain 0 → 1 → 2 → 3 stored and then read root to leaf, as a
	// request does: the root is the least recently used block.
	add := func(p Policy) {
		p.Add(entry(0))
		for i := 1; i < 4; i++ {
			p.Add(child(i, i-1))
		}
		for i := range 4 {
			p.Touch(key(i))
		}
	}
	lru := NewLRU()
	add(lru)
	wantVictim(t, lru, 0) // LRU strands 1, 2 and 3

	p := NewPrefix()
	add(p)
	wantDrain(t, p, 3, 2, 1, 0)
}

func TestPrefixSharedRootGoesAfterAllItsBranches(t *testing.T) {
	p := NewPrefix()
	p.Add(entry(0))
	p.Add(child(1, 0))
	p.Add(child(2, 0))
	p.Touch(key(0))
	wantDrain(t, p, 1, 2, 0)
}

func TestPrefixParentAddedAfterItsChild(t *testing.T) {
	p := NewPrefix()
	p.Add(child(1, 0)) // parent 0 not held yet
	p.Add(entry(0))
	p.Touch(key(1)) // 0 is now the least recently used, but has a child
	wantDrain(t, p, 1, 0)
}

func TestPrefixParentRemovedWhileChildrenRemain(t *testing.T) {
	p := NewPrefix()
	p.Add(entry(0))
	p.Add(child(1, 0))
	p.Add(child(2, 1))
	p.Remove(key(1)) // 2 is left without a held parent; 0 is a leaf again
	p.Touch(key(2))
	wantVictim(t, p, 0)
	p.Add(child(1, 0)) // back: it has its child 2 counted again
	p.Touch(key(0))
	wantDrain(t, p, 2, 1, 0)
}

func TestPrefixReAddUnderAnotherParentMovesTheChild(t *testing.T) {
	p := NewPrefix()
	p.Add(entry(10))
	p.Add(entry(20))
	p.Add(child(1, 10))
	p.Add(child(1, 20)) // 1 moves: 10 is a leaf, 20 is not
	p.Touch(key(1))
	p.Touch(key(20))
	wantDrain(t, p, 10, 1, 20)
}

func TestPrefixFallsBackToLRUWhenSkipLeavesNoLeaf(t *testing.T) {
	p := NewPrefix()
	p.Add(entry(0))
	p.Add(child(1, 0))
	p.Add(child(2, 1))
	p.Touch(key(1))
	onlyInner := func(k index.Key) bool { return k == key(2) }
	wantVictimSkip(t, p, onlyInner, 0) // 0 and 1 have children; 0 is least recent
}

func TestBeladyEvictsTheFarthestNextUse(t *testing.T) {
	// Accesses a b c, then a b c again: after the first three, c is used
	// farthest in the future, though it is the most recent (LRU takes a).
	o := NewSequenceOracle(keys(1, 2, 3, 1, 2, 3))
	p := NewBelady(o)
	for i, k := range o.seq[:3] {
		o.Seek(i)
		p.Add(Entry{Key: k})
	}
	wantDrain(t, p, 3, 2, 1)
}

func TestBeladyEvictsBlocksNeverUsedAgainFirst(t *testing.T) {
	o := NewSequenceOracle(keys(1, 2, 3, 4, 2))
	p := NewBelady(o)
	for i, k := range o.seq[:4] {
		o.Seek(i)
		p.Add(Entry{Key: k})
	}
	// 1, 3 and 4 are never used again (least recent first), 2 is.
	wantDrain(t, p, 1, 3, 4, 2)
}

func TestSequenceOracleFindsNextUses(t *testing.T) {
	o := NewSequenceOracle(keys(1, 2, 1, 3, 2, 1))
	want := []int64{2, 4, 5, Never, Never, Never}
	for i, k := range o.seq {
		o.Seek(i)
		if got := o.NextUse(k); got != want[i] {
			t.Errorf("NextUse at %d = %d, want %d", i, got, want[i])
		}
	}
	c := o.Clone()
	if got := c.NextUse(key(1)); got != 2 {
		t.Errorf("clone starts at %d's answer %d, want 2", 0, got)
	}
	defer func() {
		if recover() == nil {
			t.Error("NextUse of a key the sequence does not access there did not panic")
		}
	}()
	o.Seek(0)
	o.NextUse(key(2))
}

func BenchmarkPolicies(b *testing.B) {
	const n = 1 << 14
	for _, pc := range policies {
		// Chains of eight blocks, so that the prefix policy has children
		// to count.
		entries := make([]Entry, 4*n)
		for i := range entries {
			entries[i] = entry(i)
			if i%8 != 0 {
				entries[i] = child(i, i-1)
			}
		}
		b.Run(pc.name+"/Add", func(b *testing.B) {
			b.ReportAllocs()
			p := pc.new()
			for i := range b.N {
				if i%len(entries) == 0 {
					p = pc.new()
				}
				p.Add(entries[i%len(entries)])
			}
		})
		b.Run(pc.name+"/Touch", func(b *testing.B) {
			b.ReportAllocs()
			p := pc.new()
			for _, e := range entries[:n] {
				p.Add(e)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			order := make([]index.Key, 1024)
			for i := range order {
				order[i] = key(rng.IntN(n))
			}
			b.ResetTimer()
			for i := range b.N {
				p.Touch(order[i%len(order)])
			}
		})
		b.Run(pc.name+"/VictimRemove", func(b *testing.B) {
			b.ReportAllocs()
			p := pc.new()
			for _, e := range entries[:n] {
				p.Add(e)
			}
			b.ResetTimer()
			for i := range b.N {
				v, _ := p.Victim(nil)
				p.Remove(v)
				p.Add(entries[(n+i)%len(entries)])
			}
		})
	}
}

func key(i int) index.Key { return index.Key{NS: 7, Hash: index.Hash(i)} }

func keys(ids ...int) []index.Key {
	ks := make([]index.Key, len(ids))
	for i, id := range ids {
		ks[i] = key(id)
	}
	return ks
}

func entry(i int) Entry { return Entry{Key: key(i), Size: 1} }

func child(i, parent int) Entry {
	return Entry{Key: key(i), Parent: index.Hash(parent), HasParent: true, Size: 1}
}

func wantLen(t *testing.T, p Policy, n int) {
	t.Helper()
	if p.Len() != n {
		t.Fatalf("Len = %d, want %d", p.Len(), n)
	}
}

func wantVictim(t *testing.T, p Policy, want int) {
	t.Helper()
	wantVictimSkip(t, p, nil, want)
}

func wantVictimSkip(t *testing.T, p Policy, skip func(index.Key) bool, want int) {
	t.Helper()
	if v, ok := p.Victim(skip); !ok || v != key(want) {
		t.Fatalf("Victim = %v (ok %v), want %v", v, ok, key(want))
	}
}

// wantDrain evicts every block and checks the order.
func wantDrain(t *testing.T, p Policy, order ...int) {
	t.Helper()
	var got []int
	for p.Len() > 0 {
		v, ok := p.Victim(nil)
		if !ok {
			break
		}
		got = append(got, int(v.Hash))
		p.Remove(v)
	}
	if !slices.Equal(got, order) {
		t.Fatalf("eviction order = %v, want %v", got, order)
	}
}

// randomOracle is a deterministic stand-in for the future: the n-th
// question it is asked gets a pseudo-random position after n. Two oracles
// with the same seed asked the same questions give the same answers.
type randomOracle struct {
	rng *rand.Rand
	n   int64
}

func newRandomOracle(seed uint64) *randomOracle {
	return &randomOracle{rng: rand.New(rand.NewPCG(seed, seed))}
}

func (o *randomOracle) NextUse(index.Key) int64 {
	o.n++
	if o.rng.IntN(4) == 0 {
		return Never
	}
	return o.n + 1 + o.rng.Int64N(100)
}

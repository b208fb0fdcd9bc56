package policy

import (
	"cmp"
	"math/rand/v2"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// The models below are the policies' specifications written the slow,
// obvious way: a map of blocks and a linear scan for the victim. The heap
// based policies must pick exactly the victim their model picks, whatever
// sequence of operations they see.

func TestPoliciesMatchTheirReferenceModels(t *testing.T) {
	cases := []struct {
		name        string
		fast, model func() Policy
	}{
		{"lru", func() Policy { return NewLRU() }, func() Policy { return newModel(lruRank) }},
		{"lfu", func() Policy { return NewLFU() }, func() Policy { return newModel(lfuRank) }},
		{"prefix", func() Policy { return NewPrefix() }, func() Policy { return newModel(prefixRank) }},
		{"belady", func() Policy { return NewBelady(newRandomOracle(5)) }, func() Policy {
			m := newModel(beladyRank)
			m.oracle = newRandomOracle(5)
			return m
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := range uint64(10) {
				rng := rand.New(rand.NewPCG(seed, 7))
				fast, model := c.fast(), c.model()
				keySpace := []int{6, 24, 96}[seed%3]
				for step := range 4000 {
					op := randomOp(rng, keySpace)
					switch op.kind {
					case opAdd:
						fast.Add(op.entry)
						model.Add(op.entry)
					case opTouch:
						if f, m := fast.Touch(op.entry.Key), model.Touch(op.entry.Key); f != m {
							t.Fatalf("seed %d step %d: Touch(%v) = %v, model says %v", seed, step, op.entry.Key, f, m)
						}
					case opRemove:
						fast.Remove(op.entry.Key)
						model.Remove(op.entry.Key)
					case opVictim, opEvict:
						fv, fok := fast.Victim(op.skip)
						mv, mok := model.Victim(op.skip)
						if fv != mv || fok != mok {
							t.Fatalf("seed %d step %d: Victim = %v (%v), model says %v (%v)", seed, step, fv, fok, mv, mok)
						}
						if fok && op.kind == opEvict {
							fast.Remove(fv)
							model.Remove(mv)
						}
					}
					if fast.Len() != model.Len() {
						t.Fatalf("seed %d step %d: Len = %d, model says %d", seed, step, fast.Len(), model.Len())
					}
				}
			}
		})
	}
}

type opKind int

const (
	opAdd opKind = iota
	opTouch
	opRemove
	opVictim // look at the victim only
	opEvict  // Victim then Remove, as a tier evicts
)

type op struct {
	kind  opKind
	entry Entry                // Add; Touch and Remove use entry.Key
	skip  func(index.Key) bool // Victim and Evict; may be nil
}

// randomOp draws an operation on keys [0, keySpace). Parents are mostly the
// previous key (chains), sometimes none, sometimes any key at all — the
// block itself, or one making a cycle — to reach the prefix policy's odd
// corners.
func randomOp(rng *rand.Rand, keySpace int) op {
	i := rng.IntN(keySpace)
	var o op
	switch r := rng.IntN(20); {
	case r < 7:
		o.kind = opAdd
	case r < 11:
		o.kind = opTouch
	case r < 13:
		o.kind = opRemove
	case r < 15:
		o.kind = opVictim
	default:
		o.kind = opEvict
	}
	switch r := rng.IntN(8); {
	case r < 2 || i == 0:
		o.entry = entry(i)
	case r < 7:
		o.entry = child(i, i-1)
	default:
		o.entry = child(i, rng.IntN(keySpace))
	}
	if (o.kind == opVictim || o.kind == opEvict) && rng.IntN(3) > 0 {
		mod, rem := uint64(rng.IntN(4)+2), uint64(rng.IntN(2))
		o.skip = func(k index.Key) bool { return uint64(k.Hash)%mod == rem }
	}
	return o
}

func skipped(skip func(index.Key) bool, k index.Key) bool { return skip != nil && skip(k) }

// model is a slow reference Policy: it keeps every block's facts in a map
// and finds the victim by scanning for the block of least rank.
type model struct {
	blocks map[index.Key]*modelBlock
	clock  uint64
	age    int64 // LFU-DA's L
	victim *index.Key
	oracle Oracle
	rank   func(m *model, b *modelBlock) rank
}

type modelBlock struct {
	entry    Entry
	lastUse  uint64
	count    int64
	priority int64 // LFU-DA: L at the last access + count
	nextUse  int64
}

// rank orders blocks for eviction: smallest tier first, then smallest
// value, then least recent use.
type rank struct {
	tier  int
	value int64
}

func newModel(r func(*model, *modelBlock) rank) *model {
	return &model{blocks: map[index.Key]*modelBlock{}, rank: r}
}

func (m *model) Add(e Entry) {
	b := m.blocks[e.Key]
	if b == nil {
		b = &modelBlock{}
		m.blocks[e.Key] = b
	}
	b.entry = e
	m.access(b)
}

func (m *model) Touch(k index.Key) bool {
	b := m.blocks[k]
	if b != nil {
		m.access(b)
	}
	return b != nil
}

func (m *model) access(b *modelBlock) {
	m.victim = nil
	m.clock++
	b.lastUse = m.clock
	b.count++
	b.priority = m.age + b.count
	if m.oracle != nil {
		b.nextUse = m.oracle.NextUse(b.entry.Key)
	}
}

func (m *model) Remove(k index.Key) {
	b := m.blocks[k]
	if b == nil {
		return
	}
	if m.victim != nil && *m.victim == k {
		m.age = max(m.age, b.priority)
	}
	m.victim = nil
	delete(m.blocks, k)
}

func (m *model) Victim(skip func(index.Key) bool) (index.Key, bool) {
	var best *modelBlock
	var bestRank rank
	for k, b := range m.blocks {
		if skipped(skip, k) {
			continue
		}
		r := m.rank(m, b)
		if best == nil || cmp.Or(cmp.Compare(r.tier, bestRank.tier), cmp.Compare(r.value, bestRank.value), cmp.Compare(b.lastUse, best.lastUse)) < 0 {
			best, bestRank = b, r
		}
	}
	if best == nil {
		return index.Key{}, false
	}
	k := best.entry.Key
	m.victim = &k
	return k, true
}

func (m *model) Len() int     { return len(m.blocks) }
func (m *model) Name() string { return "model" }

func lruRank(*model, *modelBlock) rank { return rank{} }

func lfuRank(_ *model, b *modelBlock) rank { return rank{value: b.priority} }

// prefixRank puts blocks with held children behind every leaf.
func prefixRank(m *model, b *modelBlock) rank {
	for _, c := range m.blocks {
		if pk, ok := parentKey(c.entry); ok && pk == b.entry.Key {
			return rank{tier: 1}
		}
	}
	return rank{}
}

func beladyRank(_ *model, b *modelBlock) rank { return rank{value: -b.nextUse} }

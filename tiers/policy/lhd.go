package policy

import (
	"math/rand/v2"

	"github.com/kvstrata/kvstrata/index"
)

// LHD is least-hit-density eviction (Beckmann et al., NSDI '18): it evicts
// the block expected to yield the fewest hits per unit of space-time it
// would go on holding, learning that expectation online from the hits and
// evictions it observes.
//
// Every block falls in a class, from what is seen of it: how often it was
// used before (0, 1, 2, 3 or more times, counting uses before an eviction
// that its ghost remembers), how deep in its chain it is (0–3, 4–15 or 16
// and more blocks after the root) and whether a block was ever stored after
// it in its chain (a request's last block, partial, almost never is, and
// almost never comes back). Its age is the number of accesses since its
// last one, in coarse units. For each class the policy keeps a histogram of
// the ages at which its blocks were hit and at which they left; every
// reconfigure interval the histograms decay and give each (class, age) a
// hit density: the hits expected of a block of that class and age before
// it leaves, divided by the accesses it is expected to stay.
//
// Victim draws lhdSamples blocks at random (deterministically seeded)
// from those with no held children, and only if none qualifies from all
// blocks, and returns the one of lowest density, the least recently used
// on a tie (until the histograms have data every density is 0: LRU among
// the samples). Leaves first because evicting a block strands its held
// children: a lookup stops at the first block missing. Sampling from all
// blocks stayed below S3-FIFO on the Mooncake conversation trace and below
// LRU on the synthetic one (docs/BENCHMARKS.md).
//
// Evicted keys are kept as ghosts, four per held block, with their use
// count, class, age and last access. A block that comes back from its ghost
// is counted as a hit at the age it came back at, not as an eviction, and
// a ghost forgotten as an eviction at its age then: within the ghosts'
// reach the histograms see what would have happened had the block stayed,
// reuses later than blocks stay included.
//
// Add, Touch and Remove are O(1); Victim is O(lhdSamples), plus O(k) for k
// skipped blocks when the draws find none skip lets through; the
// reconfiguration, once per as many accesses as blocks held, is
// O(classes × ages). Memory: a fixed 144 KiB of histograms, plus a node,
// two slice slots, a child count and four ghosts per held block.
type LHD struct {
	items  map[index.Key]*lhdNode
	nodes  []*lhdNode // every held block, for sampling
	leaves []*lhdNode // held blocks without held children
	chains *chainCounts
	ghost  ghostQueue[lhdGhost]
	rng    *rand.Rand
	last   lastVictim

	now      uint64 // accesses so far: Add and Touch calls
	ageUnit  uint64 // accesses per age step
	reconfAt uint64 // now at the next reconfiguration

	classes [lhdClasses]lhdClass
}

var _ Policy = (*LHD)(nil)

const (
	lhdAges    = 256 // age steps in a histogram; the last holds older ages too
	lhdSamples = 64  // candidates Victim compares
	// lhdAgeSpan is how many times the blocks held the histograms' ages
	// span, in accesses: reuses on the Mooncake traces come up to ~15 ×
	// the blocks of a 1e6-token cache after the previous use.
	lhdAgeSpan = 32
	// lhdDecay is what the histograms keep of their counts at each
	// reconfiguration (one per as many accesses as blocks held). With 0.9
	// they forget faster than the traces' blocks come back, and the
	// densities are noise: conversation 8.7 % / 16.5 % at 1e6 / 3e6 tokens
	// against 9.4 % / 16.9 % with 0.99 (before the leaves-first sampling).
	lhdDecay = 0.99

	lhdUseBuckets   = 4
	lhdDepthBuckets = 3
	lhdClasses      = lhdUseBuckets * lhdDepthBuckets * 2
)

// lhdClass is one class's histograms and the densities they last gave.
type lhdClass struct {
	hits, evictions [lhdAges]float64
	density         [lhdAges]float64
}

// lhdGhost is what LHD remembers of an evicted block.
type lhdGhost struct {
	lastUse uint64
	uses    uint8 // its accesses, saturating
	class   uint8 // its class and age when evicted
	age     uint8
}

// lhdNode is a block LHD holds.
type lhdNode struct {
	entry    Entry
	lastUse  uint64 // now at its last access
	idx      int32  // position in nodes
	leafIdx  int32  // position in leaves, or -1
	uses     uint8  // accesses before the last, saturating
	depth    uint8  // blocks before it in its chain, saturating
	hadChild bool   // a block naming it as parent was added
}

// NewLHD returns an empty LHD policy.
func NewLHD() *LHD {
	p := &LHD{
		items:   make(map[index.Key]*lhdNode),
		ghost:   newGhostQueue[lhdGhost](),
		chains:  newChainCounts(),
		rng:     rand.New(rand.NewPCG(0x6c6864, 1)),
		ageUnit: 1,
	}
	p.ghost.expired = p.ghostExpired
	return p
}

func (n *lhdNode) class() int {
	d := 0
	switch {
	case n.depth >= 16:
		d = 2
	case n.depth >= 4:
		d = 1
	}
	c := int(min(n.uses, lhdUseBuckets-1))*lhdDepthBuckets + d
	if n.hadChild {
		c += lhdUseBuckets * lhdDepthBuckets
	}
	return c
}

func (p *LHD) age(n *lhdNode) int {
	return int(min((p.now-n.lastUse)/p.ageUnit, lhdAges-1))
}

func (p *LHD) Add(e Entry) {
	p.last.forget()
	if n := p.items[e.Key]; n != nil {
		p.unlinkParent(n)
		n.entry = e
		p.linkParent(n)
		p.hit(n)
		return
	}
	p.tick()
	n := &lhdNode{entry: e, lastUse: p.now, idx: int32(len(p.nodes)), leafIdx: -1}
	if g, ok := p.ghost.take(e.Key); ok {
		// Had it stayed, this would have been a hit at its age, and no
		// eviction: count it so, so that the histograms learn of reuses
		// later than the blocks stay.
		n.uses = g.uses
		cl := &p.classes[g.class]
		cl.evictions[g.age] = max(cl.evictions[g.age]-1, 0)
		cl.hits[min((p.now-g.lastUse)/p.ageUnit, lhdAges-1)]++
	}
	if pk, ok := parentKey(e); ok {
		n.depth = 255
		if parent := p.items[pk]; parent != nil {
			parent.hadChild = true
			n.depth = parent.depth + min(1, 255-parent.depth)
		}
	}
	p.items[e.Key] = n
	p.nodes = append(p.nodes, n)
	p.addLeaf(n)
	p.linkParent(n)
}

// linkParent counts n as a child of its parent, which, if held, then is
// no leaf. The count is kept whether or not the parent is held, so that a
// parent stored after its children (an SSD receives a chain's blocks as
// DRAM gives them up, leaves first) is no leaf either.
func (p *LHD) linkParent(n *lhdNode) {
	p.chains.link(n.entry)
	if pk, ok := parentKey(n.entry); ok {
		if parent := p.items[pk]; parent != nil {
			p.removeLeaf(parent)
		}
	}
}

// unlinkParent stops counting n as a child of its parent, which may become
// a leaf.
func (p *LHD) unlinkParent(n *lhdNode) {
	p.chains.unlink(n.entry)
	if pk, ok := parentKey(n.entry); ok {
		if parent := p.items[pk]; parent != nil {
			p.addLeaf(parent)
		}
	}
}

func (p *LHD) addLeaf(n *lhdNode) {
	if n.leafIdx >= 0 || p.chains.hasChildren(n.entry.Key) {
		return
	}
	n.leafIdx = int32(len(p.leaves))
	p.leaves = append(p.leaves, n)
}

func (p *LHD) removeLeaf(n *lhdNode) {
	if n.leafIdx < 0 {
		return
	}
	last := p.leaves[len(p.leaves)-1]
	last.leafIdx = n.leafIdx
	p.leaves[n.leafIdx] = last
	p.leaves = p.leaves[:len(p.leaves)-1]
	n.leafIdx = -1
}

func (p *LHD) Touch(key index.Key) bool {
	n := p.items[key]
	if n == nil {
		return false
	}
	p.last.forget()
	p.hit(n)
	return true
}

// hit records an access to a held block at its age, in its class.
func (p *LHD) hit(n *lhdNode) {
	p.tick()
	p.classes[n.class()].hits[p.age(n)]++
	n.uses += min(1, 255-n.uses)
	n.lastUse = p.now
}

func (p *LHD) Remove(key index.Key) {
	n := p.items[key]
	if n == nil {
		return
	}
	p.last.forget()
	c, a := n.class(), p.age(n)
	p.classes[c].evictions[a]++
	g := lhdGhost{lastUse: n.lastUse, uses: n.uses + min(1, 255-n.uses), class: uint8(c), age: uint8(a)}
	p.ghost.add(key, g, max(ghostsPerBlock*(len(p.items)-1), minGhosts))
	p.unlinkParent(n)
	p.removeLeaf(n)
	last := p.nodes[len(p.nodes)-1]
	last.idx = n.idx
	p.nodes[n.idx] = last
	p.nodes = p.nodes[:len(p.nodes)-1]
	delete(p.items, key)
}

func (p *LHD) Victim(skip func(index.Key) bool) (index.Key, bool) {
	if k, ok := p.last.get(skip); ok {
		return k, true
	}
	k, ok := p.victim(skip)
	p.last.set(k, ok)
	return k, ok
}

func (p *LHD) victim(skip func(index.Key) bool) (index.Key, bool) {
	if len(p.nodes) == 0 {
		return index.Key{}, false
	}
	var best *lhdNode
	bestDensity := 0.0
	consider := func(n *lhdNode) bool {
		if skip != nil && skip(n.entry.Key) {
			return false
		}
		d := p.classes[n.class()].density[p.age(n)]
		if best == nil || d < bestDensity || (d == bestDensity && n.lastUse < best.lastUse) {
			best, bestDensity = n, d
		}
		return true
	}
	// Leaves first: evicting a block with held children would leave them
	// unreachable, since a lookup stops at the first block missing.
	if p.sample(p.leaves, consider) == 0 {
		p.sample(p.nodes, consider)
	}
	if best == nil {
		return index.Key{}, false
	}
	return best.entry.Key, true
}

// sample passes up to lhdSamples blocks of set that skip lets through to
// consider, drawn at random, and returns how many it passed. When the draws
// find none (skip holds back most of set) it walks set in order until it
// has passed lhdSamples or reached the end, so that a block qualifies
// whenever one does; the walk costs O(k) for k blocks skipped.
func (p *LHD) sample(set []*lhdNode, consider func(*lhdNode) bool) int {
	if len(set) <= lhdSamples {
		got := 0
		for _, n := range set {
			if consider(n) {
				got++
			}
		}
		return got
	}
	got := 0
	for tries := 0; got < lhdSamples && tries < 4*lhdSamples; tries++ {
		if consider(set[p.rng.IntN(len(set))]) {
			got++
		}
	}
	for i := 0; got == 0 && i < len(set); i++ {
		if consider(set[i]) {
			got++
		}
	}
	return got
}

func (p *LHD) Len() int { return len(p.items) }

func (p *LHD) Name() string { return "lhd" }

// tick counts an access and reconfigures when an interval is over.
func (p *LHD) tick() {
	p.now++
	if p.now >= p.reconfAt {
		p.reconfigure()
	}
}

// reconfigure turns the histograms into densities, decays them, and sets
// the age unit for the blocks now held.
func (p *LHD) reconfigure() {
	held := uint64(max(len(p.items), 64))
	p.reconfAt = p.now + held
	for c := range p.classes {
		cl := &p.classes[c]
		var hits, events, lifetime float64
		for a := lhdAges - 1; a >= 0; a-- {
			hits += cl.hits[a]
			events += cl.hits[a] + cl.evictions[a]
			lifetime += events
			cl.density[a] = 0
			if lifetime > 0 {
				cl.density[a] = hits / lifetime
			}
			cl.hits[a] *= lhdDecay
			cl.evictions[a] *= lhdDecay
		}
	}
	p.ageUnit = max(1, held*lhdAgeSpan/lhdAges)
}

// ghostExpired moves a forgotten ghost's eviction to its age now: within
// the ghosts' reach the histograms count what would have happened had the
// block stayed.
func (p *LHD) ghostExpired(_ index.Key, g lhdGhost) {
	cl := &p.classes[g.class]
	cl.evictions[g.age] = max(cl.evictions[g.age]-1, 0)
	cl.evictions[min((p.now-g.lastUse)/p.ageUnit, lhdAges-1)]++
}

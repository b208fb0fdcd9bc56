package policy

import "github.com/kvstrata/kvstrata/index"

// WTinyLFU is W-TinyLFU eviction (Einziger et al. 2017, as in Caffeine):
// a small window LRU in front of a segmented LRU main space, with a
// frequency sketch deciding which of two candidates stays.
//
//   - Every Add and Touch is counted in a Sketch (4-bit count-min with a
//     doorkeeper, halved every 10 × width accesses).
//   - A new block enters the window, an LRU whose share of the blocks
//     starts at 1 % and is tuned by hill climbing on the hit rate (1–90 %).
//     While the cache fills, blocks beyond the window's share flow into
//     probation uncontested.
//   - The main space is a segmented LRU: probation (blocks that came from
//     the window) and protected (about 80 % of main: blocks accessed again
//     while in probation). A protected block pushed out of its share goes
//     back to the head of probation.
//   - When the window is above its share, its least recent block is the
//     candidate and main's least recent (probation first) the incumbent:
//     the candidate enters probation only if the sketch has seen it more
//     often than the incumbent, and whichever loses is the victim.
//     Otherwise the victim is main's least recent block.
//
// So a block used once rarely displaces one used again, however recent.
// Shares are of the blocks held (a tier evicts only when full). The sketch
// grows with the blocks held (width: the next power of two at or above
// them, which starts it afresh), so memory stays about 3 bytes of sketch
// per block on top of each block's node.
//
// Add, Touch and Remove are O(1) (amortised over the sketch's halvings);
// Victim is O(1) plus O(k) for k skipped blocks. Calling Victim again
// without a change in between returns the same block.
type WTinyLFU struct {
	window, probation, protected qlist
	items                        map[index.Key]*qnode
	sketch                       *Sketch
	last                         lastVictim
	climb                        climber
	chains                       *chainCounts // prefix-aware form only
}

var _ Policy = (*WTinyLFU)(nil)

const (
	inWindow uint8 = iota
	inProbation
	inProtected
)

// NewWTinyLFU returns an empty W-TinyLFU policy.
func NewWTinyLFU() *WTinyLFU {
	return &WTinyLFU{items: make(map[index.Key]*qnode), sketch: NewSketch(0), climb: newClimber()}
}

// NewWTinyLFUPrefix returns W-TinyLFU in a prefix-aware form: a block
// with held children (its chain's later blocks, which are useless without
// it) is never the window's candidate nor main's incumbent — it is moved to
// the head of its segment instead — so a chain loses its leaves before its
// ancestors, and the contest is between leaves. When no such block turns
// up within 64 blocks with children a segment, the plain form's choice
// goes.
func NewWTinyLFUPrefix() *WTinyLFU {
	p := NewWTinyLFU()
	p.chains = newChainCounts()
	return p
}

func (p *WTinyLFU) Add(e Entry) {
	p.last.forget()
	p.sketch.Increment(e.Key)
	if n := p.items[e.Key]; n != nil {
		p.chains.reparent(n.entry, e)
		n.entry = e
		p.access(n)
		p.climb.record(true, len(p.items))
		return
	}
	p.climb.record(false, len(p.items))
	n := &qnode{entry: e, queue: inWindow}
	p.items[e.Key] = n
	p.chains.link(e)
	p.window.pushFront(n)
	// One block beyond the window's share waits for Victim's contest; more
	// (while the cache fills, or after removals) flow into probation.
	for p.window.len > p.windowShare()+1 {
		w := p.window.back()
		p.window.remove(w)
		w.queue = inProbation
		p.probation.pushFront(w)
	}
	if 4*len(p.items) > 2*p.sketch.Width() {
		p.sketch = NewSketch(len(p.items))
	}
}

func (p *WTinyLFU) Touch(key index.Key) bool {
	n := p.items[key]
	if n == nil {
		return false
	}
	p.last.forget()
	p.sketch.Increment(key)
	p.access(n)
	p.climb.record(true, len(p.items))
	return true
}

func (p *WTinyLFU) access(n *qnode) {
	switch n.queue {
	case inWindow:
		p.window.moveToFront(n)
	case inProbation:
		p.probation.remove(n)
		n.queue = inProtected
		p.protected.pushFront(n)
		p.balanceProtected()
	case inProtected:
		p.protected.moveToFront(n)
	}
}

// balanceProtected moves protected blocks beyond 80 % of main back to the
// head of probation.
func (p *WTinyLFU) balanceProtected() {
	for p.protected.len*5 > 4*(p.protected.len+p.probation.len) {
		n := p.protected.back()
		p.protected.remove(n)
		n.queue = inProbation
		p.probation.pushFront(n)
	}
}

func (p *WTinyLFU) Remove(key index.Key) {
	n := p.items[key]
	if n == nil {
		return
	}
	p.last.forget()
	p.chains.unlink(n.entry)
	p.list(n.queue).remove(n)
	delete(p.items, key)
}

func (p *WTinyLFU) list(q uint8) *qlist {
	switch q {
	case inWindow:
		return &p.window
	case inProbation:
		return &p.probation
	}
	return &p.protected
}

func (p *WTinyLFU) Victim(skip func(index.Key) bool) (index.Key, bool) {
	if k, ok := p.last.get(skip); ok {
		return k, true
	}
	k, ok := p.victim(skip)
	p.last.set(k, ok)
	return k, ok
}

func (p *WTinyLFU) victim(skip func(index.Key) bool) (index.Key, bool) {
	if k, ok := p.contest(skip, p.chains); ok || p.chains == nil {
		return k, ok
	}
	// Prefix-aware: every block let through has held children.
	return p.contest(skip, nil)
}

// contest picks the victim among the blocks skip lets through, and with
// chains among those without held children.
func (p *WTinyLFU) contest(skip func(index.Key) bool, chains *chainCounts) (index.Key, bool) {
	incumbent := oldestLeaf(&p.probation, skip, chains)
	if incumbent == nil {
		incumbent = oldestLeaf(&p.protected, skip, chains)
	}
	if p.window.len > p.windowShare() || incumbent == nil {
		cand := oldestLeaf(&p.window, skip, chains)
		switch {
		case cand == nil && incumbent == nil:
			return index.Key{}, false
		case cand == nil:
			return incumbent.entry.Key, true
		case incumbent == nil:
			return cand.entry.Key, true
		}
		if p.sketch.Estimate(cand.entry.Key) <= p.sketch.Estimate(incumbent.entry.Key) {
			return cand.entry.Key, true
		}
		// The candidate wins: it moves to probation, the incumbent goes.
		p.window.remove(cand)
		cand.queue = inProbation
		p.probation.pushFront(cand)
	}
	return incumbent.entry.Key, true
}

// windowShare is the window's share of the blocks held, at least one.
func (p *WTinyLFU) windowShare() int { return max(int(p.climb.window*float64(len(p.items))), 1) }

// climber sizes the window by hill climbing on the hit rate, as Caffeine
// does: after each sample of accesses (as many as the blocks held) it moves
// the window's share by step, in the same direction if the hit rate rose
// and the other way if it fell; the step shrinks by 2 % a sample.
type climber struct {
	window       float64 // the window's share of the blocks held
	step         float64
	hits, misses int
	lastRate     float64
}

const (
	minWindow = 0.01
	maxWindow = 0.9
)

func newClimber() climber { return climber{window: minWindow, step: 0.0625} }

// record counts an access (hit: the block was held) and climbs after each
// sample.
func (c *climber) record(hit bool, held int) {
	if hit {
		c.hits++
	} else {
		c.misses++
	}
	n := c.hits + c.misses
	if n < max(held, 64) {
		return
	}
	rate := float64(c.hits) / float64(n)
	if rate < c.lastRate {
		c.step = -c.step
	}
	c.window = min(max(c.window+c.step, minWindow), maxWindow)
	c.step *= 0.98
	c.lastRate, c.hits, c.misses = rate, 0, 0
}

func (p *WTinyLFU) Len() int { return len(p.items) }

func (p *WTinyLFU) Name() string {
	if p.chains != nil {
		return "wtinylfu-prefix"
	}
	return "wtinylfu"
}

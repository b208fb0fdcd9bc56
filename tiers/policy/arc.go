package policy

import "github.com/kvstrata/kvstrata/index"

// ARC is Adaptive Replacement Cache eviction (Megiddo and Modha, FAST '03):
// two LRU lists of held blocks and two ghost lists of keys recently
// evicted from them, with a target that moves toward whichever list the
// workload rewards.
//
//   - T1 holds blocks used once since they entered, T2 blocks used again.
//     A new block enters T1; an access to a T1 block moves it to T2, an
//     access to a T2 block to T2's head.
//   - A block evicted from T1 leaves its key in ghost list B1, from T2 in
//     B2. A block added whose key is in B1 grows the target share of T1
//     (recency would have kept it) and enters T2; in B2 it shrinks the
//     target (frequency would have) and enters T2.
//   - The victim is T1's least recent block while T1 is above its target,
//     else T2's least recent.
//
// The target and the ghost lists are in blocks held, not a capacity the
// policy is not told: a tier evicts only when full, so the two agree. The
// ghost lists keep at most ghostsPerBlock keys per held block between them
// (the paper keeps one; see S3FIFO's ghostsPerBlock for why these traces
// want more), B1 at most that less T1.
//
// In the prefix-aware form (NewARCPrefix) a block with held children is
// passed over — moved to the head of its list, keeping its list — so a
// chain loses its leaves before its ancestors; when no block skip lets
// through without held children is found within 64 of them, the least
// recent block skip lets through goes.
//
// Add, Touch and Remove are O(1); Victim is O(1) plus O(k) for k skipped
// blocks (the prefix-aware form passes over at most 64 blocks with
// children a list, moving each to the head, then falls back). Calling Victim again without a change in between returns the
// same block.
type ARC struct {
	t1, t2 qlist
	b1, b2 ghostQueue[struct{}]
	items  map[index.Key]*qnode
	target int // T1's target length, 0 to the blocks held
	last   lastVictim
	chains *chainCounts // prefix-aware form only
}

var _ Policy = (*ARC)(nil)

const (
	inT1 uint8 = iota
	inT2
)

// NewARC returns an empty ARC policy.
func NewARC() *ARC {
	return &ARC{items: make(map[index.Key]*qnode), b1: newGhostQueue[struct{}](), b2: newGhostQueue[struct{}]()}
}

// NewARCPrefix returns ARC in its prefix-aware form.
func NewARCPrefix() *ARC {
	p := NewARC()
	p.chains = newChainCounts()
	return p
}

func (p *ARC) Add(e Entry) {
	p.last.forget()
	if n := p.items[e.Key]; n != nil {
		p.chains.reparent(n.entry, e)
		n.entry = e
		p.access(n)
		return
	}
	held := len(p.items) + 1
	n := &qnode{entry: e, queue: inT1}
	switch b1, b2 := p.b1.len(), p.b2.len(); {
	case p.b1.remove(e.Key):
		p.target = min(p.target+max(b2/b1, 1), held)
		n.queue = inT2
	case p.b2.remove(e.Key):
		p.target = max(p.target-max(b1/max(b2, 1), 1), 0)
		n.queue = inT2
	}
	p.items[e.Key] = n
	p.chains.link(e)
	p.list(n.queue).pushFront(n)
}

func (p *ARC) Touch(key index.Key) bool {
	n := p.items[key]
	if n == nil {
		return false
	}
	p.last.forget()
	p.access(n)
	return true
}

func (p *ARC) access(n *qnode) {
	if n.queue == inT1 {
		p.t1.remove(n)
		n.queue = inT2
		p.t2.pushFront(n)
		return
	}
	p.t2.moveToFront(n)
}

func (p *ARC) list(q uint8) *qlist {
	if q == inT1 {
		return &p.t1
	}
	return &p.t2
}

// Remove forgets key, leaving it in the ghost list of the list it was in.
func (p *ARC) Remove(key index.Key) {
	n := p.items[key]
	if n == nil {
		return
	}
	p.last.forget()
	p.chains.unlink(n.entry)
	p.list(n.queue).remove(n)
	delete(p.items, key)
	budget := max(ghostsPerBlock*len(p.items), minGhosts)
	if n.queue == inT1 {
		p.b1.add(key, struct{}{}, max(budget-p.t1.len, 0))
	} else {
		p.b2.add(key, struct{}{}, budget)
	}
	// Both lists share the budget; B2 gives way to B1.
	p.b2.trim(max(budget-p.b1.len(), 0))
}

func (p *ARC) Victim(skip func(index.Key) bool) (index.Key, bool) {
	if k, ok := p.last.get(skip); ok {
		return k, true
	}
	k, ok := p.victim(skip)
	p.last.set(k, ok)
	return k, ok
}

func (p *ARC) victim(skip func(index.Key) bool) (index.Key, bool) {
	first, second := &p.t2, &p.t1
	if p.t1.len > 0 && p.t1.len > p.target {
		first, second = &p.t1, &p.t2
	}
	for _, l := range []*qlist{first, second} {
		if n := oldestLeaf(l, skip, p.chains); n != nil {
			return n.entry.Key, true
		}
	}
	if p.chains == nil {
		return index.Key{}, false
	}
	// Prefix-aware: every block let through has held children.
	for _, l := range []*qlist{first, second} {
		if n := l.firstUnskipped(skip); n != nil {
			return n.entry.Key, true
		}
	}
	return index.Key{}, false
}

func (p *ARC) Len() int { return len(p.items) }

func (p *ARC) Name() string {
	if p.chains != nil {
		return "arc-prefix"
	}
	return "arc"
}

// maxLeafWalk bounds how many blocks with held children oldestLeaf passes
// over before it gives up, so that a Victim stays O(1) (plus the blocks
// skip rejects) however long the chains.
const maxLeafWalk = 64

// oldestLeaf returns l's oldest block that skip lets through and that has
// no held children, moving each block with children it passes to the head
// of l; with nil chains, the oldest block skip lets through. It looks at
// each block at most once, passes over at most maxLeafWalk blocks with
// children, and returns nil when none qualifies.
func oldestLeaf(l *qlist, skip func(index.Key) bool, chains *chainCounts) *qnode {
	if chains == nil {
		return l.firstUnskipped(skip)
	}
	n := l.back()
	for steps, parents := l.len, 0; n != nil && steps > 0 && parents < maxLeafWalk; steps-- {
		prev := l.prev(n)
		switch {
		case skip != nil && skip(n.entry.Key):
		case chains.hasChildren(n.entry.Key):
			l.moveToFront(n)
			parents++
		default:
			return n
		}
		if prev == nil {
			return nil
		}
		n = prev
	}
	return nil
}

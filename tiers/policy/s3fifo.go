package policy

import "github.com/kvstrata/kvstrata/index"

// S3FIFO is S3-FIFO eviction (Yang et al., SOSP '23): three FIFO queues
// that keep one-hit wonders from displacing blocks used again.
//
//   - A new block enters the small probationary queue, which holds about
//     5 % of the blocks (the paper: 10 %; see smallPercent).
//   - When the small queue is at or above its share, its oldest block
//     leaves it: to the main queue if it was accessed again while in small,
//     otherwise out of the cache, its key going to the ghost queue.
//   - Otherwise the main queue gives up its oldest block, but a block
//     accessed since it was last considered is reinserted at the head with
//     its 2-bit frequency decremented instead.
//   - A block added whose key is in the ghost queue goes straight to main.
//
// The ghost queue remembers keys only, at most four per block held (or
// 64).
// Every access sets the block's frequency to at most 3; nothing moves on an
// access. Victim does the moves the queues call for (they are what the next
// eviction would do anyway) and returns the block that then goes; calling
// it again without a change in between returns the same block.
//
// The share of the small queue is of the blocks held, not of a capacity the
// policy is not told: a tier evicts only when full, so the two agree.
//
// Add, Touch and Remove are O(1); Victim is amortised O(1) (each move
// spends one unit of a block's frequency), plus O(k) for k skipped blocks.
type S3FIFO struct {
	small, main qlist
	items       map[index.Key]*qnode
	ghost       ghostQueue[struct{}]
	last        lastVictim
	chains      *chainCounts // prefix-aware form only
}

var _ Policy = (*S3FIFO)(nil)

// NewS3FIFO returns an empty S3-FIFO policy.
func NewS3FIFO() *S3FIFO {
	return &S3FIFO{items: make(map[index.Key]*qnode), ghost: newGhostQueue[struct{}]()}
}

// NewS3FIFOPrefix returns S3-FIFO in a prefix-aware form: a block with
// held children (its chain's later blocks, which are useless without it)
// is passed over — moved to the head of small, or reinserted in main
// without spending its frequency — so a chain loses
// its leaves before its ancestors. When every block skip lets through has
// held children (skip passed over all the leaves), the oldest of them goes.
func NewS3FIFOPrefix() *S3FIFO {
	p := NewS3FIFO()
	p.chains = newChainCounts()
	return p
}

const (
	inSmall uint8 = iota
	inMain
)

// ghostsPerBlock bounds the ghost queue to this many keys per block held,
// and minGhosts is how many it keeps however few blocks are held. The
// paper sizes the ghost queue as the main queue; on the Mooncake traces,
// whose reused blocks mostly come back once and late, four per block gave
// conversation 10.7 % / 18.0 % at 1e6 / 3e6 tokens against 7.9 % / 16.0 %
// with one (docs/BENCHMARKS.md), for about 150 bytes per block more.
const (
	ghostsPerBlock = 4
	minGhosts      = 64
)

// smallPercent is the small queue's share of the held blocks, in percent.
// The paper uses 10; on the Mooncake traces 5 gave a higher hit rate at
// 1e6 and 3e6 tokens on both (conversation 10.91 % / 18.30 % against
// 10.74 % / 17.95 %, synthetic 14.79 % / 32.96 % against 14.56 % /
// 32.77 %), 1 and 3 about the same on conversation and lower on
// synthetic, 20 and above lower on both (docs/BENCHMARKS.md).
const smallPercent = 5

func (p *S3FIFO) Add(e Entry) {
	p.last.forget()
	if n := p.items[e.Key]; n != nil {
		p.chains.reparent(n.entry, e)
		n.entry = e
		p.access(n)
		return
	}
	n := &qnode{entry: e}
	p.items[e.Key] = n
	p.chains.link(e)
	if p.ghost.remove(e.Key) {
		n.queue = inMain
		p.main.pushFront(n)
		return
	}
	n.queue = inSmall
	p.small.pushFront(n)
}

func (p *S3FIFO) Touch(key index.Key) bool {
	n := p.items[key]
	if n == nil {
		return false
	}
	p.last.forget()
	p.access(n)
	return true
}

func (p *S3FIFO) access(n *qnode) { n.freq = min(n.freq+1, 3) }

func (p *S3FIFO) Remove(key index.Key) {
	p.last.forget()
	n := p.items[key]
	if n == nil {
		return
	}
	p.chains.unlink(n.entry)
	if n.queue == inSmall {
		p.small.remove(n)
		p.ghost.add(key, struct{}{}, max(ghostsPerBlock*(len(p.items)-1), minGhosts))
	} else {
		p.main.remove(n)
	}
	delete(p.items, key)
}

func (p *S3FIFO) Victim(skip func(index.Key) bool) (index.Key, bool) {
	if k, ok := p.last.get(skip); ok {
		return k, true
	}
	k, ok := p.victim(skip)
	p.last.set(k, ok)
	return k, ok
}

func (p *S3FIFO) victim(skip func(index.Key) bool) (index.Key, bool) {
	if p.small.len*100 >= smallPercent*len(p.items) || p.main.len == 0 {
		if k, ok := p.fromSmall(skip); ok {
			return k, true
		}
	}
	if k, ok := p.fromMain(skip); ok {
		return k, true
	}
	// Everything main holds is skipped: the small queue's blocks remain.
	if k, ok := p.fromSmall(skip); ok || p.chains == nil {
		return k, ok
	}
	// Prefix-aware: every block let through has held children.
	if n := p.main.firstUnskipped(skip); n != nil {
		return n.entry.Key, true
	}
	if n := p.small.firstUnskipped(skip); n != nil {
		return n.entry.Key, true
	}
	return index.Key{}, false
}

// fromSmall walks the small queue from its oldest block, moving blocks
// accessed again to main, and returns the first one that was not. The walk
// is bounded by two steps a block (the prefix-aware form moves blocks with
// children to the head, where the walk may meet them again).
func (p *S3FIFO) fromSmall(skip func(index.Key) bool) (index.Key, bool) {
	steps := 2 * p.small.len
	for n := p.small.back(); n != nil && steps > 0; steps-- {
		prev := p.small.prev(n)
		switch {
		case skip != nil && skip(n.entry.Key):
		case n.freq > 0:
			p.small.remove(n)
			n.queue, n.freq = inMain, 0
			p.main.pushFront(n)
		case p.chains.hasChildren(n.entry.Key):
			// Prefix-aware: its children go first; it waits at the head.
			p.small.moveToFront(n)
			if prev == nil {
				return index.Key{}, false
			}
		default:
			return n.entry.Key, true
		}
		n = prev
	}
	return index.Key{}, false
}

// fromMain walks the main queue from its oldest block, reinserting blocks
// with a frequency left (one less), and returns the first without. The
// walk is bounded by five steps a block (a frequency lasts three passes;
// a prefix-aware walk may find only blocks with children).
func (p *S3FIFO) fromMain(skip func(index.Key) bool) (index.Key, bool) {
	steps := 5 * p.main.len
	for n := p.main.back(); n != nil && steps > 0; steps-- {
		prev := p.main.prev(n)
		switch {
		case skip != nil && skip(n.entry.Key):
			if prev == nil {
				return index.Key{}, false
			}
		case n.freq > 0 || p.chains.hasChildren(n.entry.Key):
			n.freq -= min(n.freq, 1)
			p.main.remove(n)
			p.main.pushFront(n)
			if prev == nil {
				prev = p.main.back()
			}
		default:
			return n.entry.Key, true
		}
		n = prev
	}
	return index.Key{}, false
}

func (p *S3FIFO) Len() int { return len(p.items) }

func (p *S3FIFO) Name() string {
	if p.chains != nil {
		return "s3fifo-prefix"
	}
	return "s3fifo"
}

// ghostQueue is a FIFO of keys evicted from a policy's queues, bounded by
// a limit given at each add, each with a value of type T that the policy
// keeps for it (struct{} when it keeps none); membership is a map lookup.
// Memory: one key in a ring and one map entry per ghost.
type ghostQueue[T any] struct {
	ring []ghostSlot // FIFO; slots whose seq no longer matches are stale
	head int         // index of the oldest slot
	n    int         // slots in use
	seq  map[index.Key]ghostVal[T]
	next uint64
	// expired, if set, is called with each ghost forgotten to respect the
	// limit (not with those removed or taken).
	expired func(index.Key, T)
}

// ghostVal is a ghost's value and the seq of its live slot. The value
// comes first so that a struct{} value takes no room.
type ghostVal[T any] struct {
	val T
	seq uint64
}

type ghostSlot struct {
	key index.Key
	seq uint64
}

func newGhostQueue[T any]() ghostQueue[T] {
	return ghostQueue[T]{seq: make(map[index.Key]ghostVal[T])}
}

// add remembers key with val, then forgets the oldest ghosts beyond limit.
func (g *ghostQueue[T]) add(key index.Key, val T, limit int) {
	g.next++
	g.seq[key] = ghostVal[T]{val, g.next}
	if g.n == len(g.ring) {
		g.grow()
	}
	g.ring[(g.head+g.n)%len(g.ring)] = ghostSlot{key, g.next}
	g.n++
	g.trim(limit)
	// Stale slots (re-added or removed keys) are dropped as they surface,
	// and the ring never holds more than twice the live ghosts.
	for g.n > 2*len(g.seq)+8 {
		g.pop()
	}
}

func (g *ghostQueue[T]) pop() {
	s := g.ring[g.head]
	g.ring[g.head] = ghostSlot{}
	g.head = (g.head + 1) % len(g.ring)
	g.n--
	if cur, ok := g.seq[s.key]; ok && cur.seq == s.seq {
		delete(g.seq, s.key)
		if g.expired != nil {
			g.expired(s.key, cur.val)
		}
	}
}

func (g *ghostQueue[T]) grow() {
	ring := make([]ghostSlot, max(16, 2*len(g.ring)))
	for i := range g.n {
		ring[i] = g.ring[(g.head+i)%len(g.ring)]
	}
	g.ring, g.head = ring, 0
}

// take forgets key and returns its value, reporting whether it was a
// ghost.
func (g *ghostQueue[T]) take(key index.Key) (T, bool) {
	v, ok := g.seq[key]
	if ok {
		delete(g.seq, key)
	}
	return v.val, ok
}

// remove forgets key and reports whether it was a ghost.
func (g *ghostQueue[T]) remove(key index.Key) bool {
	_, ok := g.take(key)
	return ok
}

// len returns the number of ghosts.
func (g *ghostQueue[T]) len() int { return len(g.seq) }

// trim forgets the oldest ghosts beyond limit.
func (g *ghostQueue[T]) trim(limit int) {
	for len(g.seq) > max(limit, 0) && g.n > 0 {
		g.pop()
	}
}

// has reports whether key is a ghost.
func (g *ghostQueue[T]) has(key index.Key) bool {
	_, ok := g.seq[key]
	return ok
}

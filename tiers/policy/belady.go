package policy

import (
	"fmt"
	"math"

	"github.com/kvstrata/kvstrata/index"
)

// Never is the next use of a block that is not accessed again.
const Never int64 = math.MaxInt64

// Oracle is Belady's view of the future.
//
// Positions count accesses: the replayer numbers every access it will make
// (every Add or Touch, in order) from 0. On each Add and Touch, Belady asks
// the oracle once about the key being accessed; NextUse must then return the
// position of the first access to that key after the one being made now, or
// Never. Belady asks nothing at other times, so an oracle may answer from a
// cursor that the replayer moves before each access (see SequenceOracle).
type Oracle interface {
	NextUse(key index.Key) int64
}

// OracleFunc adapts a function to Oracle.
type OracleFunc func(key index.Key) int64

func (f OracleFunc) NextUse(key index.Key) int64 { return f(key) }

// Belady is Belady's MIN, the offline optimum for a demand-filled cache of
// equal-sized blocks: it evicts the block whose next use lies farthest in
// the future, blocks never used again first (least recently used first among
// those). It needs to know the future, so it serves as a yardstick for
// replays of a recorded trace, never as a live policy.
//
// Belady minimises misses counted block by block. A replay that counts only
// the leading blocks of a request as hits (a lookup stops at the first
// miss) is not exactly the problem MIN solves, so an online policy can, on
// some traces and capacities, score a little above it there.
//
// Add, Touch and Remove take O(log n); Victim takes O(log n) plus O(k log k)
// for k skipped blocks.
type Belady struct {
	oracle Oracle
	heap   minHeap // major: -next use (farthest first), minor: last access
	items  map[index.Key]*beladyItem
	clock  uint64
}

type beladyItem struct {
	heapItem
	entry Entry
}

var _ Policy = (*Belady)(nil)

// NewBelady returns an empty Belady policy that asks oracle about the future.
func NewBelady(oracle Oracle) *Belady {
	return &Belady{oracle: oracle, items: make(map[index.Key]*beladyItem)}
}

func (p *Belady) Add(e Entry) {
	it := p.items[e.Key]
	if it == nil {
		it = &beladyItem{}
		it.key, it.pos = e.Key, -1
		p.items[e.Key] = it
	}
	it.entry = e
	p.access(it)
}

func (p *Belady) Touch(key index.Key) bool {
	it := p.items[key]
	if it == nil {
		return false
	}
	p.access(it)
	return true
}

func (p *Belady) access(it *beladyItem) {
	p.clock++
	// -Never is MinInt64+1, so the negation never overflows; a block not
	// used again sorts before every block that is.
	it.major, it.minor = -p.oracle.NextUse(it.key), p.clock
	if it.pos < 0 {
		p.heap.push(&it.heapItem)
	} else {
		p.heap.fix(&it.heapItem)
	}
}

func (p *Belady) Remove(key index.Key) {
	if it := p.items[key]; it != nil {
		p.heap.remove(&it.heapItem)
		delete(p.items, key)
	}
}

func (p *Belady) Victim(skip func(index.Key) bool) (index.Key, bool) {
	it, ok := p.heap.firstUnskipped(skip)
	if !ok {
		return index.Key{}, false
	}
	return it.key, true
}

func (p *Belady) Len() int { return len(p.items) }

// SequenceOracle is the Oracle of an access sequence known in advance, the
// one a trace replayer has: built from every key the replay will access, in
// order, it finds each access's next use in one backward pass. Before each
// Add or Touch the replayer calls Seek with the position of that access.
//
// The tables are read-only after NewSequenceOracle; Clone gives a second
// replay its own cursor over the same tables, so one pre-pass serves many
// replays running in parallel. One SequenceOracle is not safe for concurrent
// use.
type SequenceOracle struct {
	seq  []index.Key
	next []int64
	pos  int
}

// NewSequenceOracle returns the oracle of seq, with its cursor at 0. It keeps
// seq, which the caller must not change.
func NewSequenceOracle(seq []index.Key) *SequenceOracle {
	next := make([]int64, len(seq))
	last := make(map[index.Key]int64, len(seq)/2)
	for i := len(seq) - 1; i >= 0; i-- {
		if j, ok := last[seq[i]]; ok {
			next[i] = j
		} else {
			next[i] = Never
		}
		last[seq[i]] = int64(i)
	}
	return &SequenceOracle{seq: seq, next: next}
}

// Clone returns an oracle sharing o's tables with its own cursor at 0.
func (o *SequenceOracle) Clone() *SequenceOracle {
	return &SequenceOracle{seq: o.seq, next: o.next}
}

// Len returns the number of accesses in the sequence.
func (o *SequenceOracle) Len() int { return len(o.seq) }

// Seek moves the cursor to the access at pos, the one about to be made.
func (o *SequenceOracle) Seek(pos int) { o.pos = pos }

// NextUse returns the next use of the access at the cursor. It panics if key
// is not the key of that access: the replay and its oracle disagree about
// the sequence, and every answer after that would be wrong.
func (o *SequenceOracle) NextUse(key index.Key) int64 {
	if o.pos < 0 || o.pos >= len(o.seq) {
		panic(fmt.Sprintf("policy: oracle asked about %v at position %d, outside its %d accesses", key, o.pos, len(o.seq)))
	}
	if o.seq[o.pos] != key {
		panic(fmt.Sprintf("policy: oracle asked about %v at position %d, which accesses %v", key, o.pos, o.seq[o.pos]))
	}
	return o.next[o.pos]
}

func (p *Belady) Name() string { return "belady" }

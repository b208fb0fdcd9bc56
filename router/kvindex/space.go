package kvindex

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/index"
)

// space is the index of one namespace: its blocks, each with a bitmap of
// the workers that hold it, and its workers. Everything is guarded by mu,
// but for the blocks' reference bits, which queries set atomically under
// the read lock.
type space struct {
	x           *Index
	mu          sync.RWMutex
	seed        uint64
	blockTokens int

	tab    table   // kvstrata hash → its block's slot (and first bitmap word)
	blocks []block // by slot
	// bits holds each slot's bitmap of holders: stride words a slot,
	// bit b of the row for the worker of bit index b.
	bits   []uint64
	stride int
	// refs holds the CLOCK reference bit of each slot, set when its block
	// is stored or queried, cleared by the hand. Queries set bits with
	// atomic operations under the read lock; dense, it stays in the caches.
	refs    []uint64
	free    []uint32  // slots not in use
	hand    int       // the CLOCK hand, a slot
	workers []*worker // by bit index; nil where free
	present []uint64  // bitmap of the bit indexes in use
	entries int       // bits set over all rows
	toks    []uint32  // scratch for a BlockStored's tokens
}

type block struct {
	hash index.Hash
	gen  uint32 // counts the slot's reuses: a ref of another gen is stale
	pos  int32  // the block's position in tab
	used bool
}

// ref is where an engine hash points: a slot of the generation it had then.
type ref struct{ slot, gen uint32 }

// worker is a worker's state, guarded by its space's mu.
type worker struct {
	id   WorkerID
	sp   *space
	bit  int
	gone bool // removed
	// engine maps the worker's engine hashes to its blocks. An entry is
	// valid while its slot keeps its generation; then the worker's bit is
	// set in the slot's row. Stale entries (slots pruned) are dropped when
	// met and swept when they could outnumber the valid ones.
	engine  map[uint64]ref
	sweepAt int
	// dups counts, for a slot that more than one engine hash of the
	// worker names (engines hash what kvstrata's hash ignores, e.g. a
	// cache salt), the names beyond the first.
	dups map[uint32]uint32
	live int // bits of this worker set
}

func newSpace(x *Index, ns index.Namespace) *space {
	return &space{x: x, seed: ns.Seed(), blockTokens: ns.BlockTokens,
		tab: newTable(), stride: 1, present: make([]uint64, 1)}
}

func (sp *space) addWorker(id WorkerID) *worker {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	b := 0
	for b < len(sp.workers) && sp.workers[b] != nil {
		b++
	}
	if b == len(sp.workers) {
		sp.workers = append(sp.workers, nil)
	}
	if b >= 64*sp.stride {
		sp.grow(2 * sp.stride)
	}
	w := &worker{id: id, sp: sp, bit: b, engine: map[uint64]ref{}, dups: map[uint32]uint32{}, sweepAt: 1024}
	sp.workers[b] = w
	sp.present[b/64] |= 1 << (b % 64)
	return w
}

// grow widens every row to stride words.
func (sp *space) grow(stride int) {
	nb := make([]uint64, len(sp.blocks)*stride)
	for s := range sp.blocks {
		copy(nb[s*stride:], sp.bits[s*sp.stride:(s+1)*sp.stride])
	}
	sp.bits, sp.stride = nb, stride
	sp.present = append(sp.present, make([]uint64, stride-len(sp.present))...)
}

func (sp *space) removeWorker(w *worker) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.clearWorker(w)
	w.gone = true
	sp.workers[w.bit] = nil
	sp.present[w.bit/64] &^= 1 << (w.bit % 64)
}

// moved records that slot s's table entry is now at pos.
func (sp *space) moved(s uint32, pos int) { sp.blocks[s].pos = int32(pos) }

// synced copies the first word of slot s's row to its table entry, after
// a change of the row.
func (sp *space) synced(s uint32) {
	if b := &sp.blocks[s]; b.used {
		sp.tab.ents[b.pos].row0 = sp.bits[int(s)*sp.stride]
	}
}

func (sp *space) row(s uint32) []uint64 {
	return sp.bits[int(s)*sp.stride : (int(s)+1)*sp.stride]
}

func (sp *space) has(s uint32, b int) bool { return sp.row(s)[b/64]&(1<<(b%64)) != 0 }

// slot returns the slot of h, taking a free one if h is not indexed.
func (sp *space) slot(h index.Hash) uint32 {
	if pos := sp.tab.find(h); pos >= 0 {
		return sp.tab.ents[pos].slot
	}
	var s uint32
	if n := len(sp.free); n > 0 {
		s, sp.free = sp.free[n-1], sp.free[:n-1]
	} else {
		s = uint32(len(sp.blocks))
		sp.blocks = append(sp.blocks, block{})
		sp.bits = append(sp.bits, make([]uint64, sp.stride)...)
		if int(s)/64 == len(sp.refs) {
			sp.refs = append(sp.refs, 0)
		}
	}
	b := &sp.blocks[s]
	b.hash, b.used = h, true
	b.pos = int32(sp.tab.insert(h, s, 0, sp.moved))
	return s
}

// freeSlot drops slot s, whose row is empty, from the index.
func (sp *space) freeSlot(s uint32) {
	b := &sp.blocks[s]
	sp.tab.remove(int(b.pos))
	b.used = false
	sp.refs[s/64] &^= 1 << (s % 64)
	b.gen++
	sp.free = append(sp.free, s)
}

// touch sets slot s's reference bit. It is safe under the read lock.
func (sp *space) touch(s uint32) {
	word, bit := &sp.refs[s/64], uint64(1)<<(s%64)
	if atomic.LoadUint64(word)&bit == 0 {
		atomic.OrUint64(word, bit)
	}
}

func (sp *space) empty(s uint32) bool {
	for _, v := range sp.row(s) {
		if v != 0 {
			return false
		}
	}
	return true
}

// lookup returns the slot that worker w's engine hash ek names.
func (w *worker) lookup(ek uint64) (uint32, bool) {
	r, ok := w.engine[ek]
	if !ok {
		return 0, false
	}
	if b := &w.sp.blocks[r.slot]; !b.used || b.gen != r.gen {
		delete(w.engine, ek)
		return 0, false
	}
	return r.slot, true
}

// sweep drops w's stale engine entries when they could outnumber the
// valid ones. It copies the valid ones to a new map rather than deleting
// in place: deleted entries would leave tombstones that lengthen every
// lookup of a new name.
func (w *worker) sweep() {
	if len(w.engine) <= w.sweepAt {
		return
	}
	fresh := make(map[uint64]ref, w.live+len(w.dups))
	for ek, r := range w.engine {
		if b := &w.sp.blocks[r.slot]; b.used && b.gen == r.gen {
			fresh[ek] = r
		}
	}
	w.engine = fresh
	w.sweepAt = 2*len(fresh) + 1024
}

// store applies a BlockStored of worker w.
func (sp *space) store(w *worker, e *kvevents.BlockStored) {
	x := sp.x
	if !gpu(e.Medium) {
		x.otherMedium.Add(1)
		return
	}
	bt := sp.blockTokens
	if e.LoraID != nil || e.BlockSize != int64(bt) || len(e.TokenIDs) != len(e.BlockHashes)*bt {
		x.refused.Add(1)
		return
	}
	toks := sp.toks[:0]
	for _, t := range e.TokenIDs {
		if t < 0 || t > math.MaxUint32 {
			x.refused.Add(1)
			return
		}
		toks = append(toks, uint32(t))
	}
	sp.toks = toks
	prev := sp.seed
	if e.ParentBlockHash != nil {
		s, ok := w.lookup(engineKey(*e.ParentBlockHash))
		if !ok {
			x.orphans.Add(uint64(len(e.BlockHashes)))
			return
		}
		prev = uint64(sp.blocks[s].hash)
	}
	for i, eh := range e.BlockHashes {
		h := index.ChainHash(prev, toks[i*bt:(i+1)*bt])
		prev = uint64(h)
		ek := engineKey(eh)
		if s, ok := w.lookup(ek); ok {
			if sp.blocks[s].hash == h {
				sp.touch(s)
				continue
			}
			sp.remove(w, ek) // the engine reused the name for other tokens
		}
		s := sp.slot(h)
		sp.touch(s)
		if sp.has(s, w.bit) {
			w.dups[s]++
		} else {
			sp.row(s)[w.bit/64] |= 1 << (w.bit % 64)
			sp.synced(s)
			w.live++
			sp.entries++
		}
		w.engine[ek] = ref{s, sp.blocks[s].gen}
	}
	if sp.entries > x.cfg.MaxEntries {
		sp.prune()
	}
}

// remove drops worker w's block named ek, if indexed.
func (sp *space) remove(w *worker, ek uint64) {
	s, ok := w.lookup(ek)
	if !ok {
		return
	}
	delete(w.engine, ek)
	if d := w.dups[s]; d > 0 {
		if d == 1 {
			delete(w.dups, s)
		} else {
			w.dups[s] = d - 1
		}
		return
	}
	sp.unset(w, s)
}

// unset clears w's bit in slot s, set, and frees the slot if it was the
// last.
func (sp *space) unset(w *worker, s uint32) {
	sp.row(s)[w.bit/64] &^= 1 << (w.bit % 64)
	sp.synced(s)
	w.live--
	sp.entries--
	if sp.empty(s) {
		sp.freeSlot(s)
	}
}

// clearWorker drops every block of worker w.
func (sp *space) clearWorker(w *worker) {
	for ek := range w.engine {
		if s, ok := w.lookup(ek); ok && sp.has(s, w.bit) {
			sp.unset(w, s)
		}
	}
	w.engine, w.dups, w.live, w.sweepAt = map[uint64]ref{}, map[uint32]uint32{}, 0, 1024
}

// prune drops blocks, least recently stored or queried first (CLOCK),
// until the entries are down to 15/16 of the cap.
func (sp *space) prune() {
	limit := sp.x.cfg.MaxEntries
	target := limit - limit/16
	n := len(sp.blocks)
	for spins := 0; sp.entries > target && spins <= 2*n; spins++ {
		if sp.hand >= n {
			sp.hand = 0
		}
		s := uint32(sp.hand)
		sp.hand++
		if !sp.blocks[s].used {
			continue
		}
		if word := &sp.refs[s/64]; *word&(1<<(s%64)) != 0 {
			*word &^= 1 << (s % 64)
			continue
		}
		row := sp.row(s)
		dropped := 0
		for k, word := range row {
			forEachBit(k, word, func(bit int) {
				w := sp.workers[bit]
				w.live--
				delete(w.dups, s)
				dropped++
			})
			row[k] = 0
		}
		sp.entries -= dropped
		sp.x.pruned.Add(uint64(dropped))
		sp.freeSlot(s)
	}
}

// overlap is Index.Overlap within the space. It looks the chain's blocks
// up eight at a time before it walks them, so that the memory accesses of
// eight lookups overlap instead of following one another (a map of a
// million blocks misses the CPU caches on nearly every lookup); a lookup
// past the end of the prefix held is wasted, and nothing else.
func (sp *space) overlap(hashes []index.Hash, dst []Match) []Match {
	sp.mu.RLock()
	defer sp.mu.RUnlock()
	var buf [4]uint64
	active := buf[:0]
	if sp.stride > len(buf) {
		active = make([]uint64, 0, sp.stride)
	}
	active = append(active, sp.present...)
	const batch = 8
	var found [batch]uint32
	var rows [batch]uint64 // the first word of each row, read ahead
	n := 0
	for n < len(hashes) {
		m := min(batch, len(hashes)-n)
		k := 0
		for ; k < m; k++ {
			pos := sp.tab.find(hashes[n+k])
			if pos < 0 {
				break
			}
			e := &sp.tab.ents[pos]
			found[k], rows[k] = e.slot, e.row0
		}
		for i := range k {
			s := found[i]
			sp.touch(s)
			var row []uint64
			if sp.stride > 1 {
				row = sp.row(s)
			}
			left := false
			for w := range active {
				word := rows[i]
				if w > 0 {
					word = row[w]
				}
				if lost := active[w] &^ word; lost != 0 {
					dst = sp.emit(dst, w, lost, n)
					active[w] &^= lost
				}
				left = left || active[w] != 0
			}
			if !left {
				return dst
			}
			n++
		}
		if k < m {
			break
		}
	}
	for w, word := range active {
		dst = sp.emit(dst, w, word, n)
	}
	return dst
}

// emit appends a Match of n blocks for each worker of word k of a bitmap.
func (sp *space) emit(dst []Match, k int, word uint64, n int) []Match {
	if n == 0 {
		return dst
	}
	forEachBit(k, word, func(bit int) {
		dst = append(dst, Match{Worker: sp.workers[bit].id, Blocks: n})
	})
	return dst
}

package kvindex

import (
	"math/bits"
	"math/rand/v2"

	"github.com/kvstrata/kvstrata/index"
)

// table maps a namespace's kvstrata hashes to their blocks' slots: an open
// addressing hash table with linear probing, whose entry also carries the
// first word of the block's bitmap of holders, so that a query finds a
// block and its first 64 workers in one memory access (a Go map costs two
// or three: its control word, its slot, then the bitmap elsewhere). A
// query is a walk of lookups that miss the CPU caches: this is its cost.
//
// The hashes are spread by a seeded mix, not taken as they are: they are
// xxhash64 of prompts, which a client chooses, so one that knows the table
// could otherwise pile its prompts into one run of entries.
type table struct {
	ents  []tent
	seed  uint64
	shift uint8 // 64 - log2(len(ents))
	n     int   // entries in use
	dead  int   // tombstones
}

// tent is one entry of a table.
type tent struct {
	key  index.Hash
	row0 uint64 // the first word of the block's bitmap, mirrored from space.bits
	slot uint32
	st   uint32 // tEmpty, tUsed or tDead
}

const (
	tEmpty = iota
	tUsed
	tDead
)

func newTable() table {
	return table{ents: make([]tent, 16), seed: rand.Uint64() | 1, shift: 64 - 4}
}

func (t *table) home(h index.Hash) uint64 {
	x := uint64(h) ^ t.seed
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x >> t.shift
}

// find returns h's position, or -1.
func (t *table) find(h index.Hash) int {
	mask := uint64(len(t.ents) - 1)
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.ents[i]
		if e.st == tEmpty {
			return -1
		}
		if e.st == tUsed && e.key == h {
			return int(i)
		}
	}
}

// insert adds h, absent, for slot s; it returns its position. moved is
// called with the new position of every entry a resize moves.
func (t *table) insert(h index.Hash, s uint32, row0 uint64, moved func(slot uint32, pos int)) int {
	if 4*(t.n+t.dead+1) > 3*len(t.ents) {
		size := len(t.ents)
		if 2*(t.n+1) > size {
			size *= 2
		}
		t.resize(size, moved)
	}
	mask := uint64(len(t.ents) - 1)
	for i := t.home(h); ; i = (i + 1) & mask {
		e := &t.ents[i]
		if e.st != tUsed {
			if e.st == tDead {
				t.dead--
			}
			*e = tent{key: h, row0: row0, slot: s, st: tUsed}
			t.n++
			return int(i)
		}
	}
}

// remove drops the entry at pos.
func (t *table) remove(pos int) {
	t.ents[pos] = tent{st: tDead}
	t.n--
	t.dead++
}

func (t *table) resize(size int, moved func(slot uint32, pos int)) {
	old := t.ents
	t.ents = make([]tent, size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	t.n, t.dead = 0, 0
	mask := uint64(size - 1)
	for _, e := range old {
		if e.st != tUsed {
			continue
		}
		i := t.home(e.key)
		for t.ents[i].st != tEmpty {
			i = (i + 1) & mask
		}
		t.ents[i] = e
		t.n++
		moved(e.slot, int(i))
	}
}

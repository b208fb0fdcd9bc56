package tiers

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// A hit's bookkeeping — its level's policy, its tenant's order there and
// the frequency sketch — changes state that the hierarchy's lock guards
// only when held exclusively. Were each read to take it so, on a few busy
// cores the gets would queue behind each other, and all of them behind a
// holder the OS preempts. Instead a read looks its key up without the
// lock (readIndex) and records the hit in touches, a buffer of its own.
// Whoever next takes the lock exclusively (lock) first applies what the
// buffer holds, in the order of the reads. So does a read that finds its
// stripe of the buffer half full, if the lock is free then; else it wakes
// the mover to do it.
//
// So a policy sees every hit before it decides anything, and in order: the
// gets and writes of one goroutine reach it as if each get had touched it
// itself. Under concurrent load a touch is applied after writes that came
// later than its get, and a stripe that fills up before anyone applies it
// drops further touches: the order, and the counts an admission compares,
// are then approximate.
type touches struct {
	seq     atomic.Uint64 // orders the touches of every stripe
	pending atomic.Int64  // touches held in the stripes
	stripes [touchStripes]touchStripe
	batch   []touch // under the hierarchy's lock: the touches being applied
}

const (
	touchStripes   = 16
	touchStripeLen = 64
	// A read that leaves its stripe holding touchDrainAt touches or more
	// has them applied.
	touchDrainAt = touchStripeLen / 2
)

// touch is one hit to apply: level's copy of key was read.
type touch struct {
	seq   uint64
	key   index.Key
	level uint8
}

// touchStripe is one part of the buffer, which a read picks at random, so
// that concurrent reads seldom share one. Its lock is held only to copy a
// touch in or the stripe out.
type touchStripe struct {
	mu  sync.Mutex
	n   int
	buf [touchStripeLen]touch
	_   [64]byte // the next stripe's lock on a cache line of its own
}

// record buffers a hit on level i's copy of key and reports whether its
// stripe is half full or more, so that the caller should have it applied.
func (b *touches) record(i int, key index.Key) bool {
	t := touch{seq: b.seq.Add(1), key: key, level: uint8(i)}
	s := &b.stripes[rand.Uint32()%touchStripes]
	s.mu.Lock()
	if s.n < len(s.buf) {
		s.buf[s.n] = t
		s.n++
		b.pending.Add(1)
	}
	n := s.n
	s.mu.Unlock()
	return n >= touchDrainAt
}

// take moves every buffered touch into b.batch, in the order of the
// reads. The caller holds the hierarchy's lock exclusively.
func (b *touches) take() []touch {
	b.batch = b.batch[:0]
	if b.pending.Load() == 0 {
		return b.batch
	}
	for i := range b.stripes {
		s := &b.stripes[i]
		s.mu.Lock()
		b.batch = append(b.batch, s.buf[:s.n]...)
		s.n = 0
		s.mu.Unlock()
	}
	b.pending.Add(-int64(len(b.batch)))
	slices.SortFunc(b.batch, func(x, y touch) int { return cmp.Compare(x.seq, y.seq) })
	return b.batch
}

// lock takes the hierarchy's lock exclusively and applies the hits that
// reads buffered meanwhile, so that the holder finds the policies as if
// each read had touched them itself.
func (h *Hierarchy) lock() {
	h.mu.Lock()
	h.applyTouchesLocked()
}

// applyTouchesLocked applies the buffered hits: to the policy of the level
// read, and to its tenant's order there, while the level still holds the
// key; and to the frequency sketch, which counts accesses to keys gone
// too.
func (h *Hierarchy) applyTouchesLocked() {
	for _, t := range h.reads.take() {
		if e := h.entries[t.key]; e != nil && e.in&(1<<t.level) != 0 {
			h.levels[t.level].Policy.Touch(t.key)
			h.touchOwnLocked(int(t.level), t.key)
		}
		if h.sketch != nil {
			h.sketch.Increment(t.key)
		}
	}
}

// touched records a read's hit on level i's copy of key, held in e: its
// access time now, and its touch in the buffer. It needs no lock.
func (h *Hierarchy) touched(i int, key index.Key, e *entry) {
	e.atime.Store(time.Now().UnixNano())
	if !h.reads.record(i, key) {
		return
	}
	if h.mu.TryLock() {
		h.applyTouchesLocked()
		h.mu.Unlock()
		return
	}
	select { // the mover applies them (drain)
	case h.kick <- struct{}{}:
	default:
	}
}

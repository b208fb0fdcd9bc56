package tiers

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// pin counts the unreleased leases on one key.
type pin struct {
	n   int
	end int64 // unix nanoseconds when the longest lease runs out
}

// Lease keeps a set of blocks from being evicted until it is released or
// runs out: a reader pins what it is about to fetch, a writer the blocks of
// the request it is storing.
type Lease struct {
	h    *Hierarchy
	keys []index.Key
	pins []*pin
	end  time.Time
	once sync.Once
}

// sweepEvery is how many Pin calls pass between sweeps of expired pins that
// nobody released.
const sweepEvery = 1024

// Pin leases keys for ttl (capped at Config.MaxLease). Keys need not be
// held yet: a pin taken before a Put protects the block from the moment it
// lands.
func (h *Hierarchy) Pin(keys []index.Key, ttl time.Duration) (*Lease, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("%w: lease of %v", ErrInvalid, ttl)
	}
	end := time.Now().Add(min(ttl, h.cfg.MaxLease))
	h.lock()
	defer h.mu.Unlock()
	if h.closed.Load() {
		return nil, ErrClosed
	}
	if h.pinCalls++; h.pinCalls%sweepEvery == 0 {
		for k := range h.pins {
			h.pinnedLocked(k)
		}
	}
	l := &Lease{h: h, keys: keys, pins: make([]*pin, len(keys)), end: end}
	for i, k := range keys {
		p := h.pins[k]
		if p == nil {
			p = &pin{}
			h.pins[k] = p
		}
		p.n++
		p.end = max(p.end, end.UnixNano())
		l.pins[i] = p
	}
	return l, nil
}

// Expires returns when the lease runs out.
func (l *Lease) Expires() time.Time { return l.end }

// Release ends the lease early; a second Release is a no-op.
func (l *Lease) Release() {
	l.once.Do(func() {
		h := l.h
		h.lock()
		defer h.mu.Unlock()
		for i, k := range l.keys {
			if p := l.pins[i]; h.pins[k] == p { // else it expired and was swept
				if p.n--; p.n <= 0 {
					delete(h.pins, k)
				}
			}
		}
	})
}

// pinnedLocked reports whether an unexpired lease holds key; leases that ran
// out are forgotten on the way.
func (h *Hierarchy) pinnedLocked(key index.Key) bool {
	p := h.pins[key]
	if p == nil {
		return false
	}
	if p.end < time.Now().UnixNano() {
		delete(h.pins, key)
		return false
	}
	return true
}

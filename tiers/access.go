package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
)

// View returns a block's bytes without copying them when the fastest level
// holding it can hand them out in place (dram), else in a copy: a buffer
// of the level's pool where its tier has one (PooledGetter: ssd), which
// Release gives back, else a fresh one. The View must be released; the
// lease bounds how long it may pin the bytes.
func (h *Hierarchy) View(key index.Key, lease time.Duration) (View, index.TierKind, error) {
	var v View
	_, kind, err := h.read(key, func(t Tier) (index.Header, []byte, *bufpool.Buffer, error) {
		if vt, ok := t.(Viewer); ok {
			var err error
			v, err = vt.View(key, lease)
			if err != nil {
				return index.Header{}, nil, nil, err
			}
			return v.Meta(), nil, nil, nil
		}
		return viewCopy(t, key, &v)
	})
	return v, kind, err
}

// viewCopy reads key's block from t, a tier that cannot hand it out in
// place, into a View of a copy: a buffer of the tier's pool when it has
// one (PooledGetter), the View holding the reference, else a fresh one. It
// returns what read's fn does: the copy is only ever read, so a promotion
// may share it.
func viewCopy(t Tier, key index.Key, v *View) (index.Header, []byte, *bufpool.Buffer, error) {
	if pg, ok := t.(PooledGetter); ok {
		b, ref, m, err := pg.GetPooled(key)
		if err != nil {
			return m, nil, nil, err
		}
		*v = &heapView{b: b, m: m, ref: ref}
		return m, b, ref, nil
	}
	b, m, err := t.Get(key, nil)
	if err != nil {
		return m, nil, nil, err
	}
	*v = &heapView{b: b, m: m}
	return m, b, nil, nil
}

// ViewDevice is View, except that a block whose fastest copy is in a
// DeviceViewer level (hbm) is handed out as a DeviceView, in place in
// device memory, rather than copied into host memory: exactly one of the
// View and the DeviceView is not nil. Release whichever it is.
func (h *Hierarchy) ViewDevice(key index.Key, lease time.Duration) (View, DeviceView, index.TierKind, error) {
	var (
		v  View
		dv DeviceView
	)
	_, kind, err := h.read(key, func(t Tier) (index.Header, []byte, *bufpool.Buffer, error) {
		v, dv = nil, nil
		switch vt := t.(type) {
		case Viewer:
			var err error
			if v, err = vt.View(key, lease); err != nil {
				return index.Header{}, nil, nil, err
			}
			return v.Meta(), nil, nil, nil
		case DeviceViewer:
			var err error
			if dv, err = vt.DeviceView(key, lease); err != nil {
				return index.Header{}, nil, nil, err
			}
			return dv.Meta(), nil, nil, nil
		}
		return viewCopy(t, key, &v)
	})
	if err != nil {
		return nil, nil, kind, err
	}
	return v, dv, kind, nil
}

// heapView is a View over a copy, in a pooled buffer when ref is set.
type heapView struct {
	b   []byte
	m   index.Header
	ref *bufpool.Buffer
}

func (v *heapView) Bytes() []byte      { return v.b }
func (v *heapView) Meta() index.Header { return v.m }
func (v *heapView) Release() error {
	v.ref.Release()
	v.ref = nil // a second Release gives back nothing more
	return nil
}

// PutReservation is room for one block in level 0, to be filled in place and
// committed: the zero-copy form of Put. A reservation Reserve made keeps the
// key owned (other writers of it wait) until Commit or Abort, so fill it
// promptly; one ReserveRoom made owns the key only during Commit.
type PutReservation struct {
	h    *Hierarchy
	e    *entry // nil until Commit for ReserveRoom
	m    index.Header
	res  Reservation // nil when level 0 cannot be written in place
	buf  []byte
	done bool
}

// Reserve makes room for the block m describes in level 0, evicting victims
// as Put would. The caller fills Bytes(), checks them against m.Sum, and
// calls Commit; or Abort.
func (h *Hierarchy) Reserve(m index.Header) (*PutReservation, error) {
	e, err := h.acquire(m.Key, true)
	if err != nil {
		return nil, err
	}
	r := &PutReservation{h: h, e: e, m: m}
	rt, ok := h.levels[0].Tier.(Reserver)
	if !ok {
		r.buf = make([]byte, m.Size) // Commit stores it, within the quota
		return r, nil
	}
	if err := h.holdQuota(0, m); err != nil {
		h.release(m.Key, e)
		return nil, err
	}
	if r.res, err = h.reserveIn(rt, m); err != nil {
		h.release(m.Key, e)
		return nil, err
	}
	return r, nil
}

// ReserveRoom is Reserve that takes ownership of m.Key only at Commit, for
// a writer that fills the room at the pace of a client (from a socket):
// other writers of the key go on meanwhile, and Commit waits its turn as a
// Put does. The tenant's quota is checked at Commit, which fails then with
// the error Reserve would have returned (ErrQuota), the room given back.
// Until then the room counts in level 0's use, but in no tenant's.
func (h *Hierarchy) ReserveRoom(m index.Header) (*PutReservation, error) {
	r := &PutReservation{h: h, m: m}
	rt, ok := h.levels[0].Tier.(Reserver)
	if !ok {
		r.buf = make([]byte, m.Size) // Commit stores it, within the quota
		return r, nil
	}
	if h.closed.Load() {
		return nil, ErrClosed
	}
	var err error
	if r.res, err = h.reserveIn(rt, m); err != nil {
		return nil, err
	}
	return r, nil
}

// reserveIn reserves room for m in level 0, whose tier is rt, evicting
// victims while it is full.
func (h *Hierarchy) reserveIn(rt Reserver, m index.Header) (Reservation, error) {
	for {
		res, err := rt.Reserve(m)
		if err == nil {
			return res, nil
		}
		if !errors.Is(err, ErrFull) || !h.evictOne(0) {
			if errors.Is(err, ErrFull) {
				err = fmt.Errorf("hierarchy: %v has no room and nothing evictable: %w", h.levels[0].Kind, err)
			}
			return nil, err
		}
	}
}

// Bytes returns the room to fill; len(Bytes()) is the block's size.
func (r *PutReservation) Bytes() []byte {
	if r.res != nil {
		return r.res.Bytes()
	}
	return r.buf
}

// SetSum sets the Sum of the block's Header, for a writer that hashes the
// bytes as it fills Bytes() (one pass over them while they are in the
// CPU's cache) and so knows the Sum only then. Call it before Commit.
func (r *PutReservation) SetSum(sum uint64) {
	r.m.Sum = sum
	if s, ok := r.res.(SumSetter); ok {
		s.SetSum(sum)
	}
}

// Commit publishes the block in place of any earlier version.
func (r *PutReservation) Commit() error {
	if r.done {
		return fmt.Errorf("%w: reservation already committed or aborted", ErrInvalid)
	}
	r.done = true
	if r.e == nil { // ReserveRoom: take the key now
		if err := r.own(); err != nil {
			if r.res != nil {
				r.res.Abort()
			}
			return err
		}
	}
	var err error
	if r.res != nil {
		err = r.res.Commit()
	} else {
		err = r.h.store(0, r.m, r.buf)
	}
	return r.h.stored(r.e, r.m, err)
}

// own takes ownership of the key of a reservation ReserveRoom made and,
// for room reserved in level 0's tier, holds its tenant's quota for it.
func (r *PutReservation) own() error {
	e, err := r.h.acquire(r.m.Key, true)
	if err != nil {
		return err
	}
	if r.res != nil {
		if err := r.h.holdQuota(0, r.m); err != nil {
			r.h.release(r.m.Key, e)
			return err
		}
	}
	r.e = e
	return nil
}

// Abort gives the room back and leaves the cache as it was.
func (r *PutReservation) Abort() {
	if r.done {
		return
	}
	r.done = true
	if r.res != nil {
		r.res.Abort()
	}
	if r.e != nil {
		r.h.release(r.m.Key, r.e)
	}
}

// BlockInfo describes one block for selection (eviction, listing).
type BlockInfo struct {
	index.Header
	Kinds      []index.TierKind // tiers holding it, fastest first
	LastAccess time.Time
	Pinned     bool
}

// Blocks returns a snapshot of the blocks for which keep returns true (nil
// keeps all). It holds the hierarchy's lock while it runs: keep must be cheap
// and must not call back into h.
func (h *Hierarchy) Blocks(keep func(BlockInfo) bool) []BlockInfo {
	h.lock()
	defer h.mu.Unlock()
	var out []BlockInfo
	for k, e := range h.entries {
		if e.in == 0 {
			continue
		}
		b := BlockInfo{Header: e.meta, LastAccess: time.Unix(0, e.atime.Load()), Pinned: h.pinnedLocked(k)}
		for in := e.in; in != 0; in &= in - 1 {
			b.Kinds = append(b.Kinds, h.levels[bits.TrailingZeros8(in)].Kind)
		}
		if keep == nil || keep(b) {
			out = append(out, b)
		}
	}
	return out
}

// Kinds returns the kinds of the hierarchy's levels, fastest first.
func (h *Hierarchy) Kinds() []index.TierKind {
	kinds := make([]index.TierKind, len(h.levels))
	for i, l := range h.levels {
		kinds[i] = l.Kind
	}
	return kinds
}

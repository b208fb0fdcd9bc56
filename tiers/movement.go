package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
	"unsafe"

	"github.com/kvstrata/kvstrata/index"
)

// moveLease bounds how long a demotion may pin a block's bytes in place.
const moveLease = time.Minute

// store puts a block into level i, first making room for it within its
// tenant's quota there by evicting the tenant's own victims, then evicting
// any victims from level i while the tier reports it full. The caller owns
// m.Key; on error the quota it held is given back.
func (h *Hierarchy) store(i int, m index.Header, value []byte) error {
	return h.storeWith(i, m, func() error { return h.levels[i].Tier.Put(m, value) })
}

// storeWith is store with put in place of level i's Put of the value: a
// FileFiller's FillFromFile.
func (h *Hierarchy) storeWith(i int, m index.Header, put func() error) error {
	l := h.levels[i]
	if err := h.holdQuota(i, m); err != nil {
		return err
	}
	for {
		err := put()
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrFull) || !h.evictOne(i) {
			h.unhold(m.Key)
			if errors.Is(err, ErrFull) {
				err = fmt.Errorf("hierarchy: %v has no room and nothing evictable: %w", l.Kind, err)
			}
			return err
		}
	}
}

// unhold gives back the quota the owner of key holds.
func (h *Hierarchy) unhold(key index.Key) {
	h.lock()
	if e := h.entries[key]; e != nil {
		h.unholdLocked(e, key)
	}
	h.mu.Unlock()
}

// evictOne frees one victim of level i, demoting it when the next level
// admits it. A pinned block may be demoted (the node still holds it) but is
// never dropped. It reports false when no block of the level can go: all
// are owned by other writers, or pinned with nowhere to go.
func (h *Hierarchy) evictOne(i int) bool { return h.evict(i, 0, false) }

// evict is evictOne; with own, of the blocks of tenant t only, in the
// order of the tenant's share of the level (t's quota makes room there).
// Without a quota for t on level i it evicts nothing.
func (h *Hierarchy) evict(i int, t index.TenantTag, own bool) bool {
	l := h.levels[i]
	h.lock()
	order := l.Policy
	if own {
		s := l.shares[t]
		if s == nil || s.order == nil {
			h.mu.Unlock()
			return false
		}
		order = s.order
	}
	key, ok := order.Victim(func(k index.Key) bool {
		e := h.entries[k]
		if e == nil || e.busy {
			return true
		}
		return h.pinnedLocked(k) && !h.canDemoteLocked(i, k, e)
	})
	if !ok {
		h.mu.Unlock()
		return false
	}
	e := h.entries[key]
	e.busy = true
	m, below, pinned := e.meta, e.in>>(i+1) != 0, h.pinnedLocked(key)
	admit := i+1 < len(h.levels) && !below && h.admitLocked(i+1, key)
	h.mu.Unlock()

	j, demoted := 0, false // the level the block was demoted to, if it was
	if admit {
		var err error
		j, err = h.demoteBelow(i, m, false)
		demoted = err == nil
		below = demoted
	}
	if !below && pinned { // the demotion failed: a pinned block stays
		h.release(key, e)
		return false
	}
	// The copy leaves the tier before the hierarchy records the move, all
	// at once: a reader that misses it meanwhile waits for the key (read).
	_ = l.Tier.Delete(key) // ErrNotFound: already gone, which is the goal
	h.lock()
	if demoted {
		h.setLocked(e, m, j)
		h.levels[j].demotions++
	}
	h.removedLocked(i, e, key)
	l.evictions++
	if own {
		l.quotaEvictions++
	}
	if !below {
		l.drops++
	}
	h.releaseLocked(key, e)
	h.mu.Unlock()
	return true
}

// canDemoteLocked reports whether evicting key from level i keeps a copy on
// the node: one is below already, or the next level admits it.
func (h *Hierarchy) canDemoteLocked(i int, key index.Key, e *entry) bool {
	return i+1 < len(h.levels) && (e.in>>(i+1) != 0 || h.admitLocked(i+1, key))
}

// demoteBelow copies level i's copy of a block into level i+1 or, when
// that level's device is out of space or failing writes (ErrNoSpace,
// ErrDeviceFailing) or the block's tenant's quota there refuses it
// (ErrQuota), into the next level below that takes it, so that a
// full or failing disk is passed over rather than waited for. Levels past i+1 are tried only if they admit the key, unless
// force is set (an operator's demotion). It returns the level that took
// the copy, or the last error.
func (h *Hierarchy) demoteBelow(i int, m index.Header, force bool) (int, error) {
	var err error
	for j := i + 1; j < len(h.levels); j++ {
		if j > i+1 && !force {
			h.lock()
			ok := h.admitLocked(j, m.Key)
			h.mu.Unlock()
			if !ok {
				break
			}
		}
		if err = h.copyDown(i, j, m); !errors.Is(err, ErrNoSpace) && !errors.Is(err, ErrDeviceFailing) && !errors.Is(err, ErrQuota) {
			return j, err
		}
	}
	return -1, err
}

// copyDown writes level i's copy of a block into the lower level to,
// reading it in place when the tier allows, or, from a tier that copies
// into host memory (hbm) to one written in place (dram), straight into the
// room reserved for it there.
func (h *Hierarchy) copyDown(i, to int, m index.Header) error {
	from := h.levels[i].Tier
	if c, ok := from.(HostCopier); ok {
		if rt, ok := h.levels[to].Tier.(Reserver); ok {
			return h.storeInPlace(to, rt, m, func(dst []byte) error {
				vm, err := c.CopyOut(m.Key, dst)
				if err == nil && vm != m {
					err = fmt.Errorf("%w: %v holds %+v, not the %+v recorded", ErrInvalid, h.levels[i].Kind, vm, m)
				}
				return err
			})
		}
	}
	if v, ok := from.(Viewer); ok {
		view, err := v.View(m.Key, moveLease)
		if err != nil {
			return err
		}
		err = h.store(to, view.Meta(), view.Bytes())
		if rerr := view.Release(); err == nil {
			err = rerr
		}
		return err
	}
	buf, vm, err := from.Get(m.Key, make([]byte, 0, m.Size))
	if err != nil {
		return err
	}
	return h.store(to, vm, buf)
}

// storeInPlace is store for a level written in place: it reserves room
// for m in level i (within the tenant's quota, evicting victims while the
// tier is full), has fill copy the block's bytes into it, and commits the
// reservation only after fill returned without error; else it aborts it,
// and the level is as it was. On error the quota the caller held is given
// back.
func (h *Hierarchy) storeInPlace(i int, rt Reserver, m index.Header, fill func(dst []byte) error) error {
	l := h.levels[i]
	if err := h.holdQuota(i, m); err != nil {
		return err
	}
	for {
		r, err := rt.Reserve(m)
		if err == nil {
			if err = fill(r.Bytes()); err != nil {
				r.Abort()
			} else {
				err = r.Commit()
			}
			if err != nil {
				h.unhold(m.Key)
			}
			return err
		}
		if !errors.Is(err, ErrFull) || !h.evictOne(i) {
			h.unhold(m.Key)
			if errors.Is(err, ErrFull) {
				err = fmt.Errorf("hierarchy: %v has no room and nothing evictable: %w", l.Kind, err)
			}
			return err
		}
	}
}

// admitLocked reports whether level i takes key, a victim of the level
// above, by the level's admission rule.
func (h *Hierarchy) admitLocked(i int, key index.Key) bool {
	l := h.levels[i]
	if l.AdmitByFrequency {
		return h.moreFrequentThanVictimLocked(i, key)
	}
	min := l.AdmitMinSeen
	return min <= 1 || h.sketch.Estimate(key) >= min
}

// moreFrequentThanVictimLocked is TinyLFU's admission into level i: true
// while the level is below its high watermark, else only if the sketch has
// seen key more often than the block level i would evict next.
func (h *Hierarchy) moreFrequentThanVictimLocked(i int, key index.Key) bool {
	l := h.levels[i]
	if s := l.Tier.Stats(); float64(s.Used) < l.HighWatermark*float64(s.Capacity) {
		return true
	}
	victim, ok := l.Policy.Victim(func(k index.Key) bool {
		e := h.entries[k]
		return e == nil || e.busy || k == key
	})
	return !ok || h.sketch.Estimate(key) > h.sketch.Estimate(victim)
}

// maxQueuedPromotion bounds the bytes that promotions waiting for the
// mover may hold (their data, read-only copies of hits): past it, further
// hits are not promoted, as when the queue is full.
const maxQueuedPromotion = 256 << 20

// promoteLater copies a lower-level hit up to level 0: now when the
// hierarchy is inline, else through the mover, off the reader's path
// (dropped if the mover is behind by a full queue or maxQueuedPromotion
// bytes). A promotion that is dropped or done releases p.ref.
func (h *Hierarchy) promoteLater(p promotion) {
	if h.cfg.Inline {
		h.promote(p)
		return
	}
	n := int64(len(p.data))
	if h.queued.Add(n) > maxQueuedPromotion && n > 0 {
		h.queued.Add(-n)
		p.ref.Release()
		return
	}
	select {
	case h.promoteQ <- p:
	default:
		h.queued.Add(-n)
		p.ref.Release()
	}
}

// dequeued counts out of the queued bytes a promotion the mover took.
func (h *Hierarchy) dequeued(p promotion) promotion {
	h.queued.Add(-int64(len(p.data)))
	return p
}

// promote copies a lower level's copy of a key into the levels its hits
// go to (LevelConfig.PromoteInto) that do not hold it yet, unless another
// writer owns the key: the mover's work.
func (h *Hierarchy) promote(p promotion) {
	defer p.ref.Release()
	h.lock()
	e := h.entries[p.key]
	if e == nil || e.busy || e.in&(1<<p.from) == 0 || h.closed.Load() ||
		(p.data != nil && p.meta.Sum != e.meta.Sum) { // the bytes read are no longer the current version
		h.mu.Unlock()
		return
	}
	var into []int
	for _, t := range h.levels[p.from].promoteInto {
		if e.in&(1<<t) == 0 {
			into = append(into, t)
		}
	}
	if len(into) == 0 {
		h.mu.Unlock()
		return
	}
	e.busy = true
	h.mu.Unlock()
	owned := true // until the hold that records the last copy releases the key
	for n, t := range into {
		if p.data == nil {
			if h.copyUp(p.key, e, p.from, t) != nil {
				break
			}
			continue
		}
		if h.store(t, p.meta, p.data) != nil {
			break
		}
		h.lock()
		h.setLocked(e, p.meta, t)
		h.levels[t].promotions++
		if n == len(into)-1 {
			h.releaseLocked(p.key, e)
			owned = false
		}
		h.mu.Unlock()
		h.checkWatermark(t)
	}
	if owned {
		h.release(p.key, e)
	}
}

// copyUp copies level from's copy of key, which the caller owns, into level
// to, and counts a promotion. From a tier that keeps the block in a file of
// its own (FileLocator: ssd) into one that fills blocks from files
// (FileFiller: hbm) it has the upper tier read the file (fillUp). From a
// tier that hands out its bytes in place (dram) it copies them from there:
// into a device tier that pinned them, that is DMA with no buffer in
// between.
func (h *Hierarchy) copyUp(key index.Key, e *entry, from, to int) error {
	h.lock()
	m := e.meta
	h.mu.Unlock()
	vm, filled, err := h.fillUp(key, from, to)
	if err == nil && !filled {
		vm, err = h.copyUpThroughHost(key, m, from, to)
	}
	if err != nil {
		return err
	}
	h.lock()
	h.setLocked(e, vm, to)
	h.levels[to].promotions++
	h.mu.Unlock()
	h.checkWatermark(to)
	return nil
}

// copyUpThroughHost stores level from's copy of key (recorded as m) into
// level to through host memory: from the tier's own bytes when it hands
// them out in place, else from a Get — into the room level to reserved for
// the block when it is written in place (an SSD block read straight into
// DRAM's arena), else into a buffer. It returns the stored block's Header.
func (h *Hierarchy) copyUpThroughHost(key index.Key, m index.Header, from, to int) (index.Header, error) {
	if v, ok := h.levels[from].Tier.(Viewer); ok {
		view, err := v.View(key, moveLease)
		if err != nil {
			return index.Header{}, err
		}
		vm := view.Meta()
		err = h.store(to, vm, view.Bytes())
		if rerr := view.Release(); err == nil && rerr != nil {
			_ = h.levels[to].Tier.Delete(key) // the bytes may have changed under the copy
			err = rerr
		}
		return vm, err
	}
	if rt, ok := h.levels[to].Tier.(Reserver); ok {
		err := h.storeInPlace(to, rt, m, func(dst []byte) error {
			return h.getInto(from, m, dst)
		})
		if errors.Is(err, ErrCorrupt) {
			h.lost(from, key)
		}
		return m, err
	}
	buf, gm, err := h.levels[from].Tier.Get(key, make([]byte, 0, m.Size))
	if errors.Is(err, ErrCorrupt) {
		h.lost(from, key)
	}
	if err != nil {
		return index.Header{}, err
	}
	return gm, h.store(to, gm, buf)
}

// getInto reads level from's copy of the block m records into dst, which
// is m's size: in place where the tier's Get appends into room it is
// given, as the SSD tier's pread does. A copy that is not m's block (the
// key was written anew meanwhile) fails with ErrInvalid.
func (h *Hierarchy) getInto(from int, m index.Header, dst []byte) error {
	got, gm, err := h.levels[from].Tier.Get(m.Key, dst[:0])
	if err != nil {
		return err
	}
	if gm != m || len(got) != len(dst) {
		return fmt.Errorf("%w: %v holds %+v, not the %+v recorded", ErrInvalid, h.levels[from].Kind, gm, m)
	}
	if len(got) > 0 && unsafe.SliceData(got) != unsafe.SliceData(dst) {
		copy(dst, got)
	}
	return nil
}

// fillUp stores level from's copy of key into level to straight from the
// file that holds it, when from is a FileLocator and to a FileFiller: with
// GPUDirect Storage, the bytes go from the disk into device memory with no
// host buffer in between. It reports false, having stored nothing, when
// the levels cannot: either is not such a tier, from holds the block
// elsewhere than in a file of its own (LocateFile fails: ErrNotFound, or
// as Get would, and Get then says so), the filler is turned off
// (errors.ErrUnsupported), or the bytes in the file fail their checksum
// (ErrCorrupt): the caller then reads the block through from's Get, which
// checks the bytes itself and drops a corrupt copy, as it does without
// files. Any other error of the fill is the promotion's.
func (h *Hierarchy) fillUp(key index.Key, from, to int) (index.Header, bool, error) {
	fl, ok := h.levels[from].Tier.(FileLocator)
	if !ok {
		return index.Header{}, false, nil
	}
	ff, ok := h.levels[to].Tier.(FileFiller)
	if !ok {
		return index.Header{}, false, nil
	}
	ext, err := fl.LocateFile(key)
	if err != nil {
		return index.Header{}, false, nil
	}
	defer func() { _ = ext.Release() }()
	m := ext.Meta()
	err = h.storeWith(to, m, func() error { return ff.FillFromFile(ext) })
	if errors.Is(err, errors.ErrUnsupported) || errors.Is(err, ErrCorrupt) {
		return index.Header{}, false, nil
	}
	return m, err == nil, err
}

// PromoteTo copies a block into the tier of the given kind, now, from the
// fastest level holding it below that tier: what warming a context ahead of
// need does. It reports whether it copied: a block already there or faster
// is left alone.
func (h *Hierarchy) PromoteTo(kind index.TierKind, key index.Key) (bool, error) {
	to := h.levelOf(kind)
	if to < 0 {
		return false, fmt.Errorf("hierarchy: no %v tier: %w", kind, ErrInvalid)
	}
	if _, _, err := h.Stat(key); errors.Is(err, ErrNotFound) {
		_, _, _ = h.discover(key)
	}
	e, err := h.acquire(key, false)
	if err != nil {
		return false, err
	}
	defer h.release(key, e)
	h.lock()
	in := e.in
	h.mu.Unlock()
	if in == 0 {
		return false, fmt.Errorf("hierarchy: %v: %w", key, ErrNotFound)
	}
	from := bits.TrailingZeros8(in)
	if from <= to {
		return false, nil
	}
	return true, h.copyUp(key, e, from, to)
}

// Demote moves a block's copy out of the tier of the given kind into the
// next one down (whatever its admission rule says; past a tier whose
// device is out of space), or only drops it there when a lower level holds
// it already: an operator's "move this out of DRAM". A pinned block moves too. The bottom tier has nowhere to demote to.
func (h *Hierarchy) Demote(kind index.TierKind, key index.Key) error {
	i := h.levelOf(kind)
	if i < 0 || i+1 >= len(h.levels) {
		return fmt.Errorf("hierarchy: nothing below a %v tier to demote to: %w", kind, ErrInvalid)
	}
	e, err := h.acquire(key, false)
	if err != nil {
		return err
	}
	defer h.release(key, e)
	h.lock()
	m, in := e.meta, e.in
	h.mu.Unlock()
	if in&(1<<i) == 0 {
		return fmt.Errorf("hierarchy: %v not in %v: %w", key, kind, ErrNotFound)
	}
	if in>>(i+1) == 0 { // no level below holds it yet
		j, err := h.demoteBelow(i, m, true)
		if err != nil {
			return fmt.Errorf("hierarchy: demote %v from %v: %w", key, kind, err)
		}
		h.lock()
		h.setLocked(e, m, j)
		h.levels[j].demotions++
		h.mu.Unlock()
	}
	h.dropCopy(i, e, key)
	h.lock()
	h.levels[i].evictions++
	h.mu.Unlock()
	return nil
}

// discover looks for a key the hierarchy does not know in the shared levels
// (blocks another node wrote to a shared object store) and, if one holds
// it, records that copy. It reports whether it found one and, when it
// did not, the error of a shared level that could not say because it is
// out of reach (ErrUnavailable), and which level that is.
func (h *Hierarchy) discover(key index.Key) (found bool, down int, err error) {
	for i, l := range h.levels {
		if !l.Shared {
			continue
		}
		m, serr := l.Tier.Stat(key)
		if errors.Is(serr, ErrUnavailable) && err == nil {
			down, err = i, serr // it may hold the key: out of reach for now
		}
		if serr != nil {
			continue
		}
		h.lock()
		if h.closed.Load() {
			h.mu.Unlock()
			return false, 0, nil
		}
		if e := h.entries[key]; e == nil {
			e := &entry{meta: m, in: 1 << i}
			e.atime.Store(time.Now().UnixNano())
			h.entries[key] = e
			h.publishLocked(key)
			h.chargeLocked(i, m, 1)
			h.addedLocked(i, m)
			found = true
		} else if !e.busy && e.in == 0 {
			h.setLocked(e, m, i)
			found = true
		} else {
			found = e.in != 0 // someone else recorded it meanwhile
		}
		h.mu.Unlock()
		return found, 0, nil
	}
	return false, down, err
}

// checkWatermark demotes from level i down to its low watermark once it
// passes its high one: inline, or by waking the mover.
func (h *Hierarchy) checkWatermark(i int) {
	l := h.levels[i]
	s := l.Tier.Stats()
	if float64(s.Used) <= l.HighWatermark*float64(s.Capacity) {
		return
	}
	if h.cfg.Inline {
		h.drain()
		return
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// drain brings every level that passed its high watermark down to its low
// one, top first, so that demotions into a level are settled in the same
// pass.
func (h *Hierarchy) drain() {
	h.lock() // applies the hits reads buffered, when one of them woke the mover for it
	h.mu.Unlock()
	h.trimQuotas()
	for i, l := range h.levels {
		s := l.Tier.Stats()
		if float64(s.Used) <= l.HighWatermark*float64(s.Capacity) {
			continue
		}
		for float64(s.Used) > l.LowWatermark*float64(s.Capacity) && h.evictOne(i) {
			s = l.Tier.Stats()
		}
	}
}

// run is the background mover: it promotes lower-level hits and keeps every
// level under its watermarks.
func (h *Hierarchy) run() {
	defer h.mover.Done()
	for {
		select {
		case <-h.stop:
			return
		case p := <-h.promoteQ:
			h.promote(h.dequeued(p))
		case <-h.kick:
			h.drain()
		case done := <-h.settle:
			for n := len(h.promoteQ); n > 0; n-- {
				h.promote(h.dequeued(<-h.promoteQ))
			}
			h.drain()
			close(done)
		}
	}
}

// Settle waits until the mover has carried out the promotions queued so far
// and brought every level under its high watermark.
func (h *Hierarchy) Settle() {
	if h.cfg.Inline {
		return
	}
	done := make(chan struct{})
	select {
	case h.settle <- done:
		<-done
	case <-h.stop:
	}
}

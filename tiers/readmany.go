package tiers

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvstrata/kvstrata/index"
)

// ReadMany reads keys from the fastest level holding each, a level that is
// a ManyGetter in one batch, and calls fn once per key (one call at a time,
// in any order) with the block's bytes — fn may keep them — its Header and
// the kind of tier that served it, or ErrNotFound, or (as Get) an error
// matching ErrUnavailable for a block held in a tier out of reach. Hits
// count and promote as Get's do. It is how a long chain is restored from
// an object store.
func (h *Hierarchy) ReadMany(ctx context.Context, keys []index.Key, fn func(i int, value []byte, m index.Header, kind index.TierKind, err error)) error {
	byLevel := make([][]int, len(h.levels))
	var missing []int
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	for i, k := range keys {
		e := h.entries[k]
		if e == nil || e.in == 0 {
			missing = append(missing, i)
			continue
		}
		l := bits.TrailingZeros8(e.in)
		byLevel[l] = append(byLevel[l], i)
	}
	h.mu.Unlock()
	for _, i := range missing { // maybe in a shared level another node filled
		found, down, err := h.discover(keys[i])
		if !found && err != nil {
			fn(i, nil, index.Header{}, h.levels[down].Kind, h.unreachable(down, keys[i], err))
			continue
		}
		if !found {
			h.mu.Lock()
			h.gets++
			h.misses++
			h.mu.Unlock()
			fn(i, nil, index.Header{}, 0, fmt.Errorf("hierarchy: %v: %w", keys[i], ErrNotFound))
			continue
		}
		h.mu.Lock()
		if e := h.entries[keys[i]]; e != nil && e.in != 0 {
			l := bits.TrailingZeros8(e.in)
			byLevel[l] = append(byLevel[l], i)
		}
		h.mu.Unlock()
	}
	for lvl, idx := range byLevel {
		if len(idx) == 0 {
			continue
		}
		mg, ok := h.levels[lvl].Tier.(ManyGetter)
		if !ok || len(idx) == 1 {
			for _, i := range idx {
				v, m, kind, err := h.Get(keys[i], nil)
				fn(i, v, m, kind, err)
			}
			continue
		}
		sub := make([]index.Key, len(idx))
		for j, i := range idx {
			sub[j] = keys[i]
		}
		err := mg.GetMany(ctx, sub, func(j int, v []byte, m index.Header, err error) {
			i := idx[j]
			if err == nil {
				h.hit(keys[i], lvl, v, m)
				fn(i, v, m, h.levels[lvl].Kind, nil)
				return
			}
			if errors.Is(err, ErrUnavailable) { // reading it again would wait for the store again
				fn(i, nil, index.Header{}, h.levels[lvl].Kind, h.unreachable(lvl, keys[i], err))
				return
			}
			if errors.Is(err, ErrCorrupt) {
				h.lost(lvl, keys[i])
			}
			// Moved, dropped or out of reach: one more try the usual way.
			v, m, kind, err := h.Get(keys[i], nil)
			fn(i, v, m, kind, err)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// hit counts a hit on level lvl for a block read outside read and
// schedules its promotion with the bytes read.
func (h *Hierarchy) hit(key index.Key, lvl int, v []byte, m index.Header) {
	h.mu.Lock()
	if e := h.entries[key]; e != nil {
		h.levels[lvl].Policy.Touch(key)
		h.touchOwnLocked(lvl, key)
		h.touchLocked(key, e)
	}
	h.gets++
	h.levels[lvl].hits++
	h.mu.Unlock()
	if lvl > 0 && !h.cfg.NoPromote {
		h.promoteLater(promotion{key: key, from: lvl, data: v, meta: m})
	}
}

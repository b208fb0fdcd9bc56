package tiers

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
)

// ReadMany reads keys from the fastest level holding each, a level that is
// a ManyGetter in one batch, and calls fn once per key (one call at a time,
// in any order) with the block's bytes — fn may keep them — its Header and
// the kind of tier that served it, or ErrNotFound, or (as Get) an error
// matching ErrUnavailable for a block held in a tier out of reach. Hits
// count and promote as Get's do. It is how a long chain is restored from
// an object store.
func (h *Hierarchy) ReadMany(ctx context.Context, keys []index.Key, fn func(i int, value []byte, m index.Header, kind index.TierKind, err error)) error {
	return h.readMany(ctx, keys, false, func(i int, v []byte, _ *bufpool.Buffer, m index.Header, kind index.TierKind, err error) {
		fn(i, v, m, kind, err)
	})
}

// ReadManyPooled is ReadMany for a caller that hands the bytes on and then
// lets them go (the data plane sending a restore): a level that is a
// PooledManyGetter reads into buffers it reuses, and fn gets with each
// block's bytes a reference on the buffer holding them (nil for bytes that
// are fn's to keep), which it must Release once done with them. A
// promotion of the block holds its own reference until it has copied the
// bytes up, so that the buffer is reused only once both are done.
func (h *Hierarchy) ReadManyPooled(ctx context.Context, keys []index.Key, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error)) error {
	return h.readMany(ctx, keys, true, fn)
}

// readMany is ReadMany, and ReadManyPooled when pooled is set.
func (h *Hierarchy) readMany(ctx context.Context, keys []index.Key, pooled bool, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error)) error {
	if len(keys) == 1 { // nothing to batch: read it as Get does, looking it up once
		return h.readOne(keys[0], pooled, func(v []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error) {
			fn(0, v, ref, m, kind, err)
		})
	}
	byLevel := make([][]int, len(h.levels))
	var missing []int
	h.mu.RLock()
	if h.closed.Load() {
		h.mu.RUnlock()
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
	h.mu.RUnlock()
	for _, i := range missing { // maybe in a shared level another node filled
		found, down, err := h.discover(keys[i])
		if !found && err != nil {
			fn(i, nil, nil, index.Header{}, h.levels[down].Kind, h.unreachable(down, keys[i], err))
			continue
		}
		if !found {
			h.gets.Add(1)
			h.misses.Add(1)
			fn(i, nil, nil, index.Header{}, 0, fmt.Errorf("hierarchy: %v: %w", keys[i], ErrNotFound))
			continue
		}
		h.mu.RLock()
		if e := h.entries[keys[i]]; e != nil && e.in != 0 {
			l := bits.TrailingZeros8(e.in)
			byLevel[l] = append(byLevel[l], i)
		}
		h.mu.RUnlock()
	}
	for lvl, idx := range byLevel {
		if len(idx) == 0 {
			continue
		}
		getMany := h.manyGetter(lvl, pooled)
		if getMany == nil || len(idx) == 1 {
			for _, i := range idx {
				if err := h.readOne(keys[i], pooled, func(v []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error) {
					fn(i, v, ref, m, kind, err)
				}); err != nil {
					return err
				}
			}
			continue
		}
		sub := make([]index.Key, len(idx))
		for j, i := range idx {
			sub[j] = keys[i]
		}
		err := getMany(ctx, sub, func(j int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
			i := idx[j]
			if err == nil {
				h.hit(keys[i], lvl, v, ref, m)
				fn(i, v, ref, m, h.levels[lvl].Kind, nil)
				return
			}
			if errors.Is(err, ErrUnavailable) { // reading it again would wait for the store again
				fn(i, nil, nil, index.Header{}, h.levels[lvl].Kind, h.unreachable(lvl, keys[i], err))
				return
			}
			if errors.Is(err, ErrCorrupt) {
				h.lost(lvl, keys[i])
			}
			// Moved, dropped or out of reach: one more try the usual way.
			v, m, kind, err := h.Get(keys[i], nil)
			fn(i, v, nil, m, kind, err)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// readOne reads one block of a ReadMany, or with pooled of a
// ReadManyPooled, and hands it to fn; it fails, without calling fn, only
// once the hierarchy is closed.
func (h *Hierarchy) readOne(key index.Key, pooled bool, fn func(value []byte, ref *bufpool.Buffer, m index.Header, kind index.TierKind, err error)) error {
	var (
		v    []byte
		ref  *bufpool.Buffer
		m    index.Header
		kind index.TierKind
		err  error
	)
	if pooled {
		v, ref, m, kind, err = h.getPooled(key)
	} else {
		v, m, kind, err = h.Get(key, nil)
	}
	if errors.Is(err, ErrClosed) {
		return ErrClosed
	}
	fn(v, ref, m, kind, err)
	return nil
}

// getPooled reads one block for ReadManyPooled: into a buffer of its
// level's pool where the level's tier reads single blocks into one
// (PooledGetter), else into a fresh buffer. A promotion of the block shares
// the bytes read, holding a reference of its own on their buffer, rather
// than reading the block again.
func (h *Hierarchy) getPooled(key index.Key) ([]byte, *bufpool.Buffer, index.Header, index.TierKind, error) {
	var (
		v   []byte
		ref *bufpool.Buffer
	)
	m, kind, err := h.read(key, func(t Tier) (index.Header, []byte, *bufpool.Buffer, error) {
		var m index.Header
		var err error
		if pg, ok := t.(PooledGetter); ok {
			v, ref, m, err = pg.GetPooled(key)
			return m, v, ref, err
		}
		v, m, err = t.Get(key, nil)
		return m, v, nil, err // a fresh copy, only ever read: a promotion may share it
	})
	if err != nil {
		return nil, nil, m, kind, err
	}
	return v, ref, m, kind, nil
}

// manyGetter returns level lvl's batched read — into reused buffers when
// pooled is set and the tier can — or nil when its tier has none.
func (h *Hierarchy) manyGetter(lvl int, pooled bool) func(context.Context, []index.Key, func(int, []byte, *bufpool.Buffer, index.Header, error)) error {
	tier := h.levels[lvl].Tier
	if pg, ok := tier.(PooledManyGetter); ok && pooled {
		return pg.GetManyPooled
	}
	mg, ok := tier.(ManyGetter)
	if !ok {
		return nil
	}
	return func(ctx context.Context, keys []index.Key, fn func(int, []byte, *bufpool.Buffer, index.Header, error)) error {
		return mg.GetMany(ctx, keys, func(i int, v []byte, m index.Header, err error) { fn(i, v, nil, m, err) })
	}
}

// hit counts a hit on level lvl for a block read outside read and
// schedules its promotion with the bytes read; the promotion takes its own
// reference on ref, the buffer holding them, if any.
func (h *Hierarchy) hit(key index.Key, lvl int, v []byte, ref *bufpool.Buffer, m index.Header) {
	h.mu.RLock()
	e := h.entries[key]
	h.mu.RUnlock()
	if e != nil {
		h.touched(lvl, key, e)
	}
	h.gets.Add(1)
	h.levels[lvl].hits.Add(1)
	if lvl > 0 && !h.cfg.NoPromote {
		h.promoteLater(promotion{key: key, from: lvl, data: v, ref: ref.Retain(), meta: m})
	}
}

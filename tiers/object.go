package tiers

import (
	"context"
	"errors"
	"fmt"
	"math/bits"

	"github.com/kvstrata/kvstrata/index"
)

// ObjectRange is where an object-store tier keeps a block's bytes: Size
// bytes (Meta.Size) at Offset in Object of Bucket, exactly as they were
// put, checked by Meta.Sum.
type ObjectRange struct {
	Bucket, Object string
	Offset         int64
	Meta           index.Header
}

// Placement is where the hierarchy holds a block: the kind of its fastest
// tier (0 when no tier holds it) and, when that tier is an object store
// that has stored it, the range of the object it lies in.
type Placement struct {
	Kind     index.TierKind
	Meta     index.Header
	Object   ObjectRange
	InObject bool // Object is set
}

// Locate says where each key is. A key whose fastest copy is in an object
// store — or that only a shared object store holds, written by another
// node — comes with its object range. Keys held nowhere have Kind 0; an
// error is returned only for a closed hierarchy or a cancelled ctx.
func (h *Hierarchy) Locate(ctx context.Context, keys []index.Key) ([]Placement, error) {
	loc := -1 // the level that is an ObjectLocator
	for i, l := range h.levels {
		if _, ok := l.Tier.(ObjectLocator); ok {
			loc = i
			break
		}
	}
	out := make([]Placement, len(keys))
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h.mu.RLock()
		if h.closed.Load() {
			h.mu.RUnlock()
			return nil, ErrClosed
		}
		lvl := -1
		if e := h.entries[k]; e != nil && e.in != 0 {
			lvl = bits.TrailingZeros8(e.in)
			out[i] = Placement{Kind: h.levels[lvl].Kind, Meta: e.meta}
		}
		h.mu.RUnlock()
		if loc < 0 || (lvl >= 0 && lvl != loc) {
			continue // in a faster tier, or no object store to ask
		}
		r, err := h.levels[loc].Tier.(ObjectLocator).LocateObject(ctx, k)
		switch {
		case err == nil:
			out[i] = Placement{Kind: h.levels[loc].Kind, Meta: r.Meta, Object: r, InObject: true}
		case errors.Is(err, ErrNotFound):
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			// The store is down or the lookup failed: the block stays
			// readable through the node (which will say why), so report
			// it without an object range rather than fail the batch.
		}
	}
	return out, nil
}

// String describes a placement for logs and errors.
func (p Placement) String() string {
	switch {
	case p.Kind == 0:
		return "nowhere"
	case p.InObject:
		return fmt.Sprintf("%v: %s/%s@%d+%d", p.Kind, p.Object.Bucket, p.Object.Object, p.Object.Offset, p.Meta.Size)
	}
	return p.Kind.String()
}

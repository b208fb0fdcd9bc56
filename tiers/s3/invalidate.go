package s3

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// A Delete takes a block out of the map at once but out of its segment's
// index object only later (delete.go): until then a crash, and the Open
// that follows, brings the block back. That is harmless for an eviction,
// not for the older copy of a key a faster tier has just replaced: the
// restarted node would answer with the older value. Invalidate is the
// delete for that case. It returns once no index object in the bucket
// can list a copy of the key this node dropped:
//
//   - a block of the open segment never reached the store: dropping it
//     from memory is enough;
//   - a block of a sealed segment is left out of the index its upload
//     writes, unless an upload had already taken the index to write it
//     (segment.indexTried); then Invalidate waits for the segment's
//     upload, which queues the block's removal if the index it wrote
//     lists it;
//   - a block of a stored segment, and any copy whose removal is queued
//     or being applied (an earlier Delete, an older duplicate a rescan
//     found), waits for the rewrite of its index object: Invalidate
//     applies the queued deletes now rather than after DeleteDelay.
//
// Concurrent invalidations share the rewrites: while one applyDeletes is
// in flight the others queue their keys and wait, and the next one takes
// them all, one rewrite per segment (group commit). The tier counts the
// copies each key may still have in the bucket (Tier.unsure), so that
// MayResurrect is one map lookup.

// Invalidate deletes key's block, if the tier holds one, and returns once
// neither it nor any copy of key deleted before can be listed by an index
// object in the bucket, so that no Open after a crash finds one. It
// waits at most RequestTimeout; when the store is unavailable or too
// slow, it fails with an error wrapping tiers.ErrUnavailable, and the
// deletes stay queued for the background deleter.
func (t *Tier) Invalidate(key index.Key) error {
	ctx, cancel := t.requestContext(context.Background())
	defer cancel()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("s3: invalidate %v: %w", key, tiers.ErrClosed)
	}
	if b := t.blocks[key]; b != nil {
		t.unlinkLocked(b, true)
	}
	t.mu.Unlock()

	for {
		t.mu.Lock()
		if t.unsure[key] == 0 {
			t.mu.Unlock()
			return nil
		}
		seg := t.sealedListingLocked(key)
		t.mu.Unlock()

		var err error
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case seg != nil:
			err = t.flushSegment(ctx, seg, make(chan struct{}, 1))
		default:
			err = t.applyDeletesFor(ctx, key)
		}
		if err == nil {
			continue // our key may have been queued again meanwhile
		}
		t.mu.Lock()
		done := t.unsure[key] == 0
		t.mu.Unlock()
		if done {
			return nil // another segment's rewrite failed, not ours
		}
		if !errors.Is(err, tiers.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", tiers.ErrUnavailable, err)
		}
		return fmt.Errorf("s3: invalidate %v: the store did not take the delete: %w", key, err)
	}
}

// applyDeletesFor applies the queued deletes unless, once no other
// applyDeletes is in flight, none of key's is left: the one in flight
// took them (group commit).
func (t *Tier) applyDeletesFor(ctx context.Context, key index.Key) error {
	if err := t.avail.err(); err != nil {
		return err
	}
	if err := t.lockDeletes(ctx); err != nil {
		return err
	}
	defer t.unlockDeletes()
	t.mu.Lock()
	done := t.unsure[key] == 0
	t.mu.Unlock()
	if done {
		return nil
	}
	return t.applyDeletesHeld(ctx)
}

// MayResurrect reports whether an index object in the bucket may list a
// copy of key after a crash: one this node deleted, whose removal is
// queued, being applied, or waits for the upload of a sealed segment, or
// one the tier holds. The hierarchy asks it of keys it does not know the
// tier holds, and a shared bucket may hold one the hierarchy never saw:
// another node's, found by a rescan.
func (t *Tier) MayResurrect(key index.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.blocks[key] != nil || t.unsure[key] > 0
}

// unsureLocked adds d to the count of copies of key the bucket may still
// list although the map dropped them.
func (t *Tier) unsureLocked(key index.Key, d int) {
	if n := t.unsure[key] + d; n > 0 {
		t.unsure[key] = n
	} else {
		delete(t.unsure, key)
	}
}

// droppedLocked records that key's block left a sealed segment whose
// index object, listing it, may be in the store already.
func (t *Tier) droppedLocked(seg *segment, key index.Key) {
	if seg.dropped == nil {
		seg.dropped = map[index.Key]struct{}{}
	}
	if _, ok := seg.dropped[key]; !ok {
		seg.dropped[key] = struct{}{}
		t.unsureLocked(key, 1)
	}
}

// sealedListingLocked returns a sealed segment whose index object in the
// store may list key although its block was deleted, or nil.
func (t *Tier) sealedListingLocked(key index.Key) *segment {
	for _, seg := range t.sealed {
		if _, ok := seg.dropped[key]; ok {
			return seg
		}
	}
	return nil
}

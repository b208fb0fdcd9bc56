package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Deletes reach the bucket late and in batches. Delete takes a block out
// of the map at once; the index object of its segment is rewritten
// without it by the delete loop, DeleteDelay after the first delete of a
// batch (or by Flush), and a segment left without blocks is deleted, index
// first, then data. A rewrite reads the index object as it is in the
// bucket, drops the deleted keys and writes it back, so that it keeps what
// other nodes removed before; two nodes that rewrite one index at the same
// instant may bring back a block the other removed, intact, which the
// next delete of it removes again.

// queueDeleteLocked records that key must go from the index object of the
// stored segment seg.
func (t *Tier) queueDeleteLocked(seg *segment, key index.Key) {
	keys := t.deletes[seg]
	if keys == nil {
		keys = map[index.Key]struct{}{}
		t.deletes[seg] = keys
	}
	if _, ok := keys[key]; !ok {
		keys[key] = struct{}{}
		t.unsureLocked(key, 1)
	}
	t.wakeDeleter()
}

// queuedLocked reports whether key waits to go from seg's index.
func (t *Tier) queuedLocked(seg *segment, key index.Key) bool {
	_, ok := t.deletes[seg][key]
	return ok
}

func (t *Tier) wakeDeleter() {
	select {
	case t.deleteWake <- struct{}{}:
	default:
	}
}

// deleteLoop applies the queued deletes DeleteDelay after it is woken,
// once the store is available; a batch that fails is tried again.
func (t *Tier) deleteLoop() {
	defer t.wg.Done()
	for {
		select {
		case <-t.stop:
			return
		case <-t.deleteWake:
		}
		gather := time.NewTimer(t.cfg.DeleteDelay)
		select {
		case <-t.stop:
			gather.Stop()
			return
		case <-gather.C:
		}
		select {
		case <-t.stop:
			return
		case <-t.avail.upCh():
		}
		if err := t.applyDeletes(t.ctx); err != nil {
			t.cfg.Logger.Warn("s3: applying deletes failed; they are tried again", "err", err)
			t.wakeDeleter()
		}
	}
}

// applyDeletes rewrites the index object of every segment with queued
// deletes, Concurrency at a time. Deletes that fail go back in the queue.
// One runs at a time; a caller that finds one in flight waits for it (or
// for ctx) and then applies what was queued meanwhile, so that concurrent
// callers share one rewrite per segment.
func (t *Tier) applyDeletes(ctx context.Context) error {
	if err := t.lockDeletes(ctx); err != nil {
		return err
	}
	defer t.unlockDeletes()
	return t.applyDeletesHeld(ctx)
}

// lockDeletes waits until no applyDeletes is in flight, or ctx ends, and
// keeps others from starting until unlockDeletes.
func (t *Tier) lockDeletes(ctx context.Context) error {
	select {
	case t.deleteSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("apply deletes: %w", ctx.Err())
	}
}

func (t *Tier) unlockDeletes() { <-t.deleteSem }

// applyDeletesHeld is applyDeletes for a caller of lockDeletes.
func (t *Tier) applyDeletesHeld(ctx context.Context) error {
	t.mu.Lock()
	batch := t.deletes
	t.deletes = map[*segment]map[index.Key]struct{}{}
	for seg, keys := range batch {
		seg.rewriting = true
		seg.version++
		t.deleting += int64(len(keys))
	}
	t.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}

	segs := slices.Collect(maps.Keys(batch))
	errs := make([]error, len(segs))
	slots := make(chan struct{}, t.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, seg := range segs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[i] = t.rewriteIndex(ctx, seg, batch[seg])
		})
	}
	wg.Wait()

	t.mu.Lock()
	for i, seg := range segs {
		seg.rewriting = false
		seg.version++
		t.deleting -= int64(len(batch[seg]))
		for key := range batch[seg] {
			t.unsureLocked(key, -1)
		}
		if errs[i] != nil && seg.state == segStored {
			for key := range batch[seg] {
				t.queueDeleteLocked(seg, key)
			}
		}
	}
	t.mu.Unlock()
	return errors.Join(errs...)
}

// rewriteIndex removes keys from a stored segment's index object, or
// deletes the segment when no block is left.
func (t *Tier) rewriteIndex(ctx context.Context, seg *segment, keys map[index.Key]struct{}) error {
	t.mu.Lock()
	stored := seg.state == segStored
	t.mu.Unlock()
	if !stored {
		return nil // forgotten meanwhile
	}
	name := t.lay.indexName(seg.id)
	raw, _, err := t.store.getAll(ctx, name, maxIndexBytes)
	switch {
	case errors.Is(err, errMissing):
		t.mu.Lock()
		t.forgetSegmentLocked(seg) // another node deleted it
		t.mu.Unlock()
		return nil
	case err != nil:
		return fmt.Errorf("segment %v: %w", seg.id, err)
	}
	x, err := decodeIndex(raw)
	if err == nil && x.ID != seg.id {
		err = corruptf("index names segment %v", x.ID)
	}
	if err != nil {
		// A damaged index cannot be edited; its blocks stay as they are.
		t.ctr.corruptIndexes.Add(1)
		t.cfg.Logger.Warn("s3: index object is damaged; deletes from it are dropped", "object", name, "err", err)
		return nil
	}
	n := len(x.Entries)
	x.Entries = slices.DeleteFunc(x.Entries, func(e indexEntry) bool {
		_, del := keys[e.Meta.Key]
		return del
	})
	switch {
	case len(x.Entries) == n:
		return nil
	case len(x.Entries) == 0:
		// Index first: a crash in between leaves a data object no index
		// names (garbage), never an index naming a missing object.
		if err := t.store.remove(ctx, name); err != nil {
			return fmt.Errorf("segment %v: %w", seg.id, err)
		}
		if err := t.store.remove(ctx, t.lay.dataName(seg.id)); err != nil {
			t.cfg.Logger.Warn("s3: deleting an empty segment's data object failed; it stays as garbage",
				"object", t.lay.dataName(seg.id), "err", err)
		}
		t.mu.Lock()
		t.forgetSegmentLocked(seg)
		t.mu.Unlock()
		t.ctr.segmentDeletes.Add(1)
		return nil
	}
	enc := encodeIndex(nil, x)
	etag, err := t.store.put(ctx, name, bytes.NewReader(enc), int64(len(enc)))
	if err != nil {
		return fmt.Errorf("segment %v: %w", seg.id, err)
	}
	t.mu.Lock()
	if seg.state == segStored {
		seg.etag, seg.indexSize = etag, int64(len(enc))
	}
	t.mu.Unlock()
	t.ctr.indexRewrites.Add(1)
	return nil
}

package s3

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
)

// missLookback is how far back in seal time an incremental rescan lists
// index objects: it covers segments whose upload took a while and clocks
// of other nodes that run behind. Segments older than that are found by
// the periodic full rescan.
const missLookback = time.Minute

// listedIndex is an index object a listing found.
type listedIndex struct {
	id   segID
	etag string
}

// rescan lists the bucket's index objects and merges those it does not
// know, or whose ETag changed, into the map. A full rescan lists them all
// and also forgets the segments whose index object is gone (another node
// deleted them); an incremental one lists those sealed in the last
// missLookback. It reads the new indexes Concurrency at a time, never
// the data.
func (t *Tier) rescan(ctx context.Context, full bool) error {
	t.mu.Lock()
	gen := t.gen
	t.gen++
	t.rescans++
	t.mu.Unlock()

	start := ""
	if !full {
		start = t.lay.indexNameAt(time.Now().Add(-missLookback))
	}
	var listed []listedIndex
	err := t.store.list(ctx, t.lay.indexPrefix(), start, func(o minio.ObjectInfo) {
		if id, ok := t.lay.parseIndexName(o.Key); ok {
			listed = append(listed, listedIndex{id: id, etag: o.ETag})
		}
	})
	if err != nil {
		return err
	}

	var todo []listedIndex
	seen := make(map[segID]struct{}, len(listed))
	t.mu.Lock()
	for _, l := range listed {
		seen[l.id] = struct{}{}
		if seg := t.segs[l.id]; seg == nil || seg.state == segStored && seg.etag != l.etag {
			todo = append(todo, l)
		}
	}
	if full {
		for id, seg := range t.segs {
			if _, ok := seen[id]; !ok && seg.state == segStored && seg.gen <= gen && !seg.rewriting {
				t.forgetSegmentLocked(seg)
			}
		}
	}
	t.mu.Unlock()

	errs := make([]error, len(todo))
	slots := make(chan struct{}, t.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, l := range todo {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[i] = t.readIndex(ctx, l.id)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readIndex reads one index object and merges it.
func (t *Tier) readIndex(ctx context.Context, id segID) error {
	t.mu.Lock()
	var version uint64
	if seg := t.segs[id]; seg != nil {
		version = seg.version
	}
	t.mu.Unlock()
	name := t.lay.indexName(id)
	raw, etag, err := t.store.getAll(ctx, name, maxIndexBytes)
	switch {
	case errors.Is(err, errMissing):
		return nil // deleted since the listing; the next full rescan forgets it
	case err != nil:
		return err
	}
	x, err := decodeIndex(raw)
	if err == nil && x.ID != id {
		err = corruptf("index names segment %v", x.ID)
	}
	if err != nil {
		t.ctr.corruptIndexes.Add(1)
		t.cfg.Logger.Warn("s3: index object is damaged; its blocks are ignored", "object", name, "err", err)
		return nil
	}
	t.mu.Lock()
	t.mergeLocked(x, etag, int64(len(raw)), version)
	t.mu.Unlock()
	return nil
}

// mergeLocked brings the map in line with index x of a segment, read
// when the segment's version was version:
//
//   - a segment the tier is uploading, or whose index it rewrote since,
//     is left alone (its own view is newer);
//   - blocks the map has of the segment that x no longer lists are
//     dropped (another node deleted them);
//   - of two copies of one key, in two segments, the one in the newer
//     segment wins, and a block still in memory beats every stored one;
//     the losing copy is queued for removal from its index, so that
//     duplicates do not pin old segments. Keys this node deleted and has
//     not yet removed from x stay deleted.
func (t *Tier) mergeLocked(x *segIndex, etag string, size int64, version uint64) {
	seg := t.segs[x.ID]
	switch {
	case seg == nil:
		seg = newSegment(0, segStored, time.Time{})
		seg.id, seg.gen = x.ID, t.gen
		t.segs[x.ID] = seg
	case seg.state != segStored || seg.rewriting || seg.version != version:
		return
	}
	seg.etag, seg.dataSize, seg.indexSize = etag, x.DataSize, size

	listed := make(map[*block]bool, len(x.Entries))
	for _, e := range x.Entries {
		key := e.Meta.Key
		cur := t.blocks[key]
		switch {
		case cur != nil && cur.seg == seg:
			listed[cur] = true
			continue
		case t.queuedLocked(seg, key):
			continue
		case cur != nil && (cur.seg.state != segStored || cur.seg.id.newer(seg.id)):
			t.queueDeleteLocked(seg, key)
			continue
		case cur != nil:
			t.unlinkLocked(cur, true)
		}
		b := &block{meta: e.Meta, seg: seg, off: e.Offset}
		t.linkLocked(b)
		listed[b] = true
	}
	for b := range seg.members {
		if !listed[b] {
			t.unlinkLocked(b, false)
		}
	}
}

// rescanLoop runs a full rescan every RescanInterval while the store is
// available, and after one, every GarbageAge/2 at most, sweeps garbage.
func (t *Tier) rescanLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.RescanInterval)
	defer tick.Stop()
	var swept time.Time
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		if t.avail.err() != nil {
			continue
		}
		if err := t.rescan(t.ctx, true); err != nil {
			if t.ctx.Err() == nil {
				t.cfg.Logger.Warn("s3: rescan failed", "err", err)
			}
			continue
		}
		t.unlisted.Store(false)
		if t.cfg.GarbageAge > 0 && time.Since(swept) >= t.cfg.GarbageAge/2 {
			swept = time.Now()
			if err := t.sweepGarbage(t.ctx); err != nil && t.ctx.Err() == nil {
				t.cfg.Logger.Warn("s3: garbage sweep failed", "err", err)
			}
		}
	}
}

// rescanForMiss runs an incremental rescan for a Get or Stat of a key the
// map lacks, unless one ran less than MissRescanInterval ago; callers that
// find one in flight wait for it. It reports whether the map may have
// changed, so that the caller looks again.
func (t *Tier) rescanForMiss(ctx context.Context) bool {
	if t.cfg.MissRescanInterval < 0 || t.avail.err() != nil {
		return false
	}
	t.missMu.Lock()
	if run := t.missRun; run != nil {
		t.missMu.Unlock()
		select {
		case <-run:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if !t.missLast.IsZero() && time.Since(t.missLast) < t.cfg.MissRescanInterval {
		t.missMu.Unlock()
		return false
	}
	run := make(chan struct{})
	t.missRun, t.missLast = run, time.Now()
	t.missMu.Unlock()

	err := t.rescan(ctx, false)

	t.missMu.Lock()
	t.missRun = nil
	t.missMu.Unlock()
	close(run)
	return err == nil
}

// sweepGarbage deletes the data objects written more than GarbageAge ago
// (by the store's clock) that no segment the tier knows has: after a full
// rescan, the segments of every index object in the bucket. A younger one
// may be another node's upload whose index is still on its way.
func (t *Tier) sweepGarbage(ctx context.Context) error {
	var candidates []string
	err := t.store.list(ctx, t.lay.dataPrefix(), "", func(o minio.ObjectInfo) {
		if _, ok := t.lay.parseDataName(o.Key); ok && !o.LastModified.IsZero() && time.Since(o.LastModified) > t.cfg.GarbageAge {
			candidates = append(candidates, o.Key)
		}
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range candidates {
		id, _ := t.lay.parseDataName(name)
		t.mu.Lock()
		_, known := t.segs[id]
		t.mu.Unlock()
		if known {
			continue
		}
		if err := t.store.remove(ctx, name); err != nil {
			errs = append(errs, err)
			continue
		}
		t.ctr.garbageDeletes.Add(1)
		t.cfg.Logger.Info("s3: deleted a data object no index names", "object", name)
	}
	return errors.Join(errs...)
}

package s3

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
)

// Get appends the block's bytes to dst and returns them with its Header; see
// tiers.Tier. A block in memory is copied from there; a stored one is read
// with one ranged GET of exactly its bytes, within RequestTimeout. Bytes
// that fail their checksum are never returned: the block is dropped and
// Get fails with tiers.ErrCorrupt. While the store is unavailable, Get of
// a stored block fails at once with tiers.ErrUnavailable.
func (t *Tier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	ctx, cancel := t.requestContext(context.Background())
	defer cancel()
	v, m, err := t.get(ctx, key, dst)
	if err != nil {
		return nil, index.Header{}, fmt.Errorf("s3: get %v: %w", key, err)
	}
	return v, m, nil
}

// Stat returns a block's Meta from the map, without reading its bytes.
// While the store is unavailable, Stat of a stored block fails at once
// with tiers.ErrUnavailable, as Get of it would.
func (t *Tier) Stat(key index.Key) (index.Header, error) {
	ctx, cancel := t.requestContext(context.Background())
	defer cancel()
	b, err := t.lookup(ctx, key)
	if err == nil && !b.inMemory {
		err = t.avail.err()
	}
	if err != nil {
		return index.Header{}, fmt.Errorf("s3: stat %v: %w", key, err)
	}
	return b.meta, nil
}

// GetMany reads the blocks of keys and calls fn once for each key with its
// position in keys, the block's bytes and Meta, or the error Get would
// return. Blocks stored next to each other in one segment (the blocks of a
// chain demoted together) are read with ONE ranged GET of up to
// Config.SegmentSize bytes, which an object store serves far faster than
// many small ones; up to Config.Concurrency such reads are in flight. Each
// block is checked against its checksum on its own, and handed out as soon
// as its bytes are in, while the rest of its range is still arriving.
// Calls of fn come one at a time, in no particular order; value is the
// caller's to keep (it may share memory with other blocks of its read,
// never with later calls). When ctx ends, the keys not yet read get ctx's
// error. GetMany returns ctx.Err(), or tiers.ErrClosed.
func (t *Tier) GetMany(ctx context.Context, keys []index.Key, fn func(i int, value []byte, m index.Header, err error)) error {
	return t.getMany(ctx, keys, nil, func(i int, v []byte, _ *bufpool.Buffer, m index.Header, err error) {
		fn(i, v, m, err)
	})
}

// GetManyPooled is GetMany reading stored blocks into buffers the tier
// reuses (see tiers.PooledManyGetter): fn gets with each block's bytes a
// reference on the buffer holding them, or nil for bytes that are the
// caller's to keep, and releases it once done with them.
func (t *Tier) GetManyPooled(ctx context.Context, keys []index.Key, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error {
	return t.getMany(ctx, keys, t.bufs, fn)
}

// getMany is GetMany reading into buffers from pool, or freshly allocated
// ones when pool is nil.
func (t *Tier) getMany(ctx context.Context, keys []index.Key, pool *bufpool.Pool, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error {
	if t.isClosed() {
		return fmt.Errorf("s3: get many: %w", tiers.ErrClosed)
	}
	runs := t.runs(ctx, keys)
	var next atomic.Int64
	var fnMu sync.Mutex
	emit := func(i int, v []byte, ref *bufpool.Buffer, m index.Header, err error) {
		if err != nil {
			err = fmt.Errorf("s3: get %v: %w", keys[i], err)
		}
		fnMu.Lock()
		fn(i, v, ref, m, err)
		fnMu.Unlock()
	}
	var wg sync.WaitGroup
	for range min(t.cfg.Concurrency, len(runs)) {
		wg.Go(func() {
			for {
				r := int(next.Add(1) - 1)
				if r >= len(runs) {
					return
				}
				t.readRun(ctx, keys, runs[r], pool, emit)
			}
		})
	}
	wg.Wait()
	return ctx.Err()
}

// run is a stretch of keys whose blocks lie back to back in one stored
// segment (or a single key that does not).
type run struct {
	first, n int     // keys[first : first+n]
	found    []found // their lookups; nil for a key lookup failed on
	err      error   // the lookup's error, for a single failed key
}

// runs looks keys up and groups them into runs of adjacent blocks.
func (t *Tier) runs(ctx context.Context, keys []index.Key) []run {
	var out []run
	var bytes int64
	for i, k := range keys {
		f, err := t.lookup(ctx, k)
		if err != nil {
			out = append(out, run{first: i, n: 1, err: err})
			continue
		}
		if len(out) > 0 {
			last := &out[len(out)-1]
			if p := last.found; last.err == nil && len(p) > 0 && !f.inMemory && !p[0].inMemory &&
				f.name == p[0].name && f.off == p[len(p)-1].off+int64(p[len(p)-1].meta.Size) &&
				bytes+int64(f.meta.Size) <= t.cfg.SegmentSize {
				last.found = append(last.found, f)
				last.n++
				bytes += int64(f.meta.Size)
				continue
			}
		}
		out = append(out, run{first: i, n: 1, found: []found{f}})
		bytes = int64(f.meta.Size)
	}
	return out
}

// errNoRange sends a run that needs no ranged GET (a block in memory, or
// empty blocks) to the reads one by one.
var errNoRange = errors.New("no range to read")

// readRun reads one run with one request, each block into a buffer of
// its own from pool (or a fresh one when pool is nil), and hands out each
// block as soon as its bytes are in, with the reference on its buffer.
// Blocks the request did not deliver are read again one by one, so that
// each gets its own answer.
func (t *Tier) readRun(ctx context.Context, keys []index.Key, r run, pool *bufpool.Pool, emit func(int, []byte, *bufpool.Buffer, index.Header, error)) {
	if err := ctx.Err(); err != nil {
		for i := range r.n {
			emit(r.first+i, nil, nil, index.Header{}, err)
		}
		return
	}
	if r.err != nil {
		emit(r.first, nil, nil, index.Header{}, r.err)
		return
	}
	refs := make([]*bufpool.Buffer, len(r.found))
	dsts := make([][]byte, len(r.found))
	var size int64
	for i, f := range r.found {
		if pool != nil && f.meta.Size > 0 {
			refs[i] = pool.Get(int(f.meta.Size))
			dsts[i] = refs[i].Bytes()
		} else {
			dsts[i] = make([]byte, f.meta.Size)
		}
		size += int64(f.meta.Size)
	}
	done := 0 // blocks handed out
	var err error
	if r.found[0].inMemory || size == 0 { // nothing to ask the store for
		err = errNoRange
	}
	rctx, cancel := t.requestContext(ctx)
	if err == nil {
		err = t.getSlot(rctx)
	}
	if err == nil {
		err = t.store.getRangeInto(rctx, r.found[0].name, r.found[0].off, dsts, func(i int) {
			f, v, ref := r.found[i], dsts[i], refs[i]
			done = i + 1
			if sum := index.Checksum(v); sum != f.meta.Sum {
				ref.Release()
				emit(r.first+i, nil, nil, index.Header{}, t.dropCorrupt(f, corruptf("checksum %016x, want %016x", sum, f.meta.Sum)))
				return
			}
			emit(r.first+i, v, ref, f.meta, nil) // the reference is the caller's now
		})
		<-t.getSlots
	}
	cancel()
	if err == nil {
		return
	}
	for i := done; i < r.n; i++ { // one by one, so that each block gets its own answer (a copy for a block in memory)
		refs[i].Release()
		rctx, cancel := t.requestContext(ctx)
		v, m, err := t.get(rctx, keys[r.first+i], nil)
		cancel()
		emit(r.first+i, v, nil, m, err)
	}
}

// getSlot takes one of the Concurrency slots of ranged GETs; the caller
// gives it back with <-t.getSlots. It fails at once while the store is
// unavailable, and as soon as the store is marked so while it waits.
func (t *Tier) getSlot(ctx context.Context) error {
	cut := t.avail.cut()
	if err := t.avail.err(); err != nil {
		return err
	}
	select {
	case t.getSlots <- struct{}{}:
		return nil
	case <-cut.Done():
		if err := t.avail.err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: the store was marked unavailable", tiers.ErrUnavailable)
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for a free request slot: %w", tiers.ErrUnavailable, ctx.Err())
	}
}

// requestContext bounds one caller's request by RequestTimeout and by
// Close.
func (t *Tier) requestContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, t.cfg.RequestTimeout)
	stop := context.AfterFunc(t.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (t *Tier) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// found is what lookup returns: a block's Meta and where its bytes are.
type found struct {
	b        *block
	meta     index.Header
	inMemory bool
	data     []byte   // when inMemory
	seg      *segment // when stored
	name     string
	off      int64
}

// lookup finds key in the map, after a miss rescan if it is not there.
func (t *Tier) lookup(ctx context.Context, key index.Key) (found, error) {
	for try := 0; ; try++ {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return found{}, tiers.ErrClosed
		}
		b := t.blocks[key]
		var f found
		if b != nil {
			f = found{b: b, meta: b.meta, seg: b.seg, off: b.off}
			if b.seg.state == segStored {
				f.name = t.lay.dataName(b.seg.id)
			} else {
				f.inMemory, f.data = true, b.data
			}
		}
		t.mu.Unlock()
		if b != nil {
			return f, nil
		}
		if try > 0 || !t.rescanForMiss(ctx) {
			return found{}, tiers.ErrNotFound
		}
	}
}

// get looks key up and reads its bytes. A block whose segment turns out
// to be gone is looked up once more: a newer copy may have replaced it.
func (t *Tier) get(ctx context.Context, key index.Key, dst []byte) ([]byte, index.Header, error) {
	for try := 0; ; try++ {
		f, err := t.lookup(ctx, key)
		if err != nil {
			return nil, index.Header{}, err
		}
		v, err := t.read(ctx, f, dst)
		switch {
		case err == nil:
			return v, f.meta, nil
		case errors.Is(err, errMissing) && try == 0:
			continue
		case errors.Is(err, errMissing):
			return nil, index.Header{}, fmt.Errorf("%w: %w", tiers.ErrNotFound, err)
		}
		return nil, index.Header{}, err
	}
}

// read appends the bytes of a block lookup found to dst and checks them.
func (t *Tier) read(ctx context.Context, f found, dst []byte) ([]byte, error) {
	size := int64(f.meta.Size)
	var v []byte
	switch {
	case f.inMemory:
		v = append(dst, f.data...)
	case size == 0:
		v = dst
	default:
		if err := t.getSlot(ctx); err != nil {
			return nil, err
		}
		var err error
		v, err = t.store.getRange(ctx, f.name, f.off, size, dst)
		<-t.getSlots
		switch {
		case errors.Is(err, errMissing):
			t.segmentGone(ctx, f.seg)
			return nil, err
		case errors.Is(err, errShort):
			return nil, t.dropCorrupt(f, err)
		case err != nil:
			return nil, err
		}
	}
	if sum := index.Checksum(v[len(dst):]); sum != f.meta.Sum {
		return nil, t.dropCorrupt(f, corruptf("checksum %016x, want %016x", sum, f.meta.Sum))
	}
	return v, nil
}

// segmentGone forgets a stored segment whose data object is gone, and
// deletes its index object, if still there, so that no node reads it
// again. Data is written before its index and deleted after it, so an
// index whose data is missing is of a segment that is gone for good (a
// lifecycle rule expired it, say).
func (t *Tier) segmentGone(ctx context.Context, seg *segment) {
	t.mu.Lock()
	stored := seg.state == segStored
	t.forgetSegmentLocked(seg)
	t.mu.Unlock()
	if !stored {
		return
	}
	name := t.lay.indexName(seg.id)
	if err := t.store.remove(ctx, name); err != nil {
		t.cfg.Logger.Warn("s3: deleting the index of a segment whose data is gone failed", "object", name, "err", err)
	}
}

// dropCorrupt drops a block whose bytes failed, if the map still has it,
// and returns the error to report, which wraps tiers.ErrCorrupt.
func (t *Tier) dropCorrupt(f found, cause error) error {
	t.mu.Lock()
	if t.blocks[f.meta.Key] == f.b {
		t.unlinkLocked(f.b, true)
	}
	t.mu.Unlock()
	t.ctr.corruptBlocks.Add(1)
	where := "memory"
	if !f.inMemory {
		where = fmt.Sprintf("%s at %d", f.name, f.off)
	}
	t.cfg.Logger.Warn("s3: dropped a corrupt block", "key", f.meta.Key, "where", where, "err", cause)
	if !errors.Is(cause, tiers.ErrCorrupt) {
		cause = fmt.Errorf("%w: %w", tiers.ErrCorrupt, cause)
	}
	return fmt.Errorf("%s: %w", where, cause)
}

// LocateObject says where the store keeps key's bytes, so that a client
// with its own credentials can read them with a ranged GET (see
// tiers.ObjectLocator). A block not uploaded yet is ErrNotFound: it is only
// in this node's memory.
func (t *Tier) LocateObject(ctx context.Context, key index.Key) (tiers.ObjectRange, error) {
	f, err := t.lookup(ctx, key)
	if err != nil {
		return tiers.ObjectRange{}, fmt.Errorf("s3: locate %v: %w", key, err)
	}
	if f.inMemory {
		return tiers.ObjectRange{}, fmt.Errorf("s3: locate %v: %w (not uploaded yet)", key, tiers.ErrNotFound)
	}
	return tiers.ObjectRange{Bucket: t.cfg.Bucket, Object: f.name, Offset: f.off, Meta: f.meta}, nil
}

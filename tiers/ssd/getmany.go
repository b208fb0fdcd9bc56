package ssd

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

// GetMany reads keys' blocks with up to Config.ReadWindow reads in flight,
// and calls fn once per key, one call at a time, from the calling
// goroutine, as the reads complete: with the block's bytes (fn's to keep)
// and Header, or the error Get would return for it. Ahead of the reads,
// one goroutine opens the keys' block files in order and asks the kernel
// for each whole file (posix_fadvise POSIX_FADV_WILLNEED), up to
// Config.ReadAhead bytes ahead of the reads done: the disk gets the chain
// as a deep queue of requests, as a sequential read gets it from the
// kernel's readahead, and each read copies bytes already cached or on
// their way, from the file opened for it. A large block none of whose
// pages is cached is instead read directly, from the disk into the block's
// buffer, by its read (readfile.go): the page cache is neither filled nor
// copied from, and the window of reads is the disk's queue. Reads start in
// the order of keys, so that the blocks of a chain arrive roughly in
// order. Each block is checked against its record as Get checks it, and a
// corrupt block is dropped and reported with an error wrapping
// tiers.ErrCorrupt. A block is read as it was when its file was opened: a
// Put or Delete of its key meanwhile does not change what GetMany returns
// for it, as with a Get that started first. GetMany fails only as a whole:
// with tiers.ErrClosed, or with ctx's error once ctx is done, after which
// it starts no more reads and fn hears of no more keys.
func (t *Tier) GetMany(ctx context.Context, keys []index.Key, fn func(i int, value []byte, m index.Header, err error)) error {
	return t.getMany(ctx, keys, false, func(i int, v []byte, _ *bufpool.Buffer, m index.Header, err error) { fn(i, v, m, err) })
}

// GetManyPooled is GetMany reading each block into a buffer of the tier's
// pool (tiers.PooledManyGetter): fn owns the reference it is given with
// each value and releases it once done, and the buffer is then reused for
// a later read instead of a fresh slice being allocated and zeroed for
// every block of a chain.
func (t *Tier) GetManyPooled(ctx context.Context, keys []index.Key, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error {
	return t.getMany(ctx, keys, true, fn)
}

// maxOpenAhead bounds the block files GetMany holds open ahead of its
// reads, whatever their size: ReadAhead bytes of small blocks would be
// many files.
const maxOpenAhead = 128

// opened is a key of a GetMany, looked up ahead of its read: its block
// file open and asked for (f set), or an inline block (neither f nor err
// set: read as Get reads it), or the error Get would meet.
type opened struct {
	i   int
	key index.Key
	b   located
	err error
}

// getMany is GetMany, into pooled buffers when pooled is set.
func (t *Tier) getMany(ctx context.Context, keys []index.Key, pooled bool, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error {
	// t.life is taken by each open and each read, not across the batch:
	// fn may call the tier (the hierarchy reads a block again after an
	// error), and a read lock taken again while Close waits for the lock
	// would deadlock.
	t.life.RLock()
	closed := t.closed
	t.life.RUnlock()
	if closed {
		return fmt.Errorf("ssd: get many: %w", tiers.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ssd: get many: %w", err)
	}
	type result struct {
		i   int
		v   []byte
		ref *bufpool.Buffer
		m   index.Header
		err error
	}
	window := min(t.cfg.ReadWindow, len(keys))
	stop := make(chan struct{}) // closed when GetMany gives up early

	// The opener opens the keys in order into queue. ahead counts the
	// bytes of the files asked for and not yet read; a reader that
	// finishes one wakes the opener when it waits for ahead to fall below
	// ReadAhead.
	queue := make(chan opened, min(len(keys), maxOpenAhead))
	var ahead atomic.Int64
	wake := make(chan struct{}, 1)
	var opener sync.WaitGroup
	opener.Add(1)
	go func() {
		defer opener.Done()
		defer close(queue)
		for i, key := range keys {
			for ahead.Load() >= t.cfg.ReadAhead {
				// A reader that sees ctx done returns without reading
				// the file it took, nor waking the opener: the opener
				// watches ctx too, and closes the queue.
				select {
				case <-wake:
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
			if ctx.Err() != nil {
				return
			}
			o := t.openAhead(key)
			o.i = i
			if o.b.f.isOpen() && !o.b.f.direct() {
				ahead.Add(int64(o.b.m.Size))
			}
			select {
			case queue <- o:
			case <-stop:
				o.b.close(nil)
				return
			}
		}
	}()

	// The readers read the keys in the order the opener queued them; a
	// finished read waits in results until fn has had the ones before it,
	// so that at most 2×window blocks are held at once.
	results := make(chan result, window)
	var readers sync.WaitGroup
	for range window {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for o := range queue {
				if ctx.Err() != nil {
					o.b.close(nil)
					return
				}
				var r result
				r.i = o.i
				size := int64(o.b.m.Size)
				asked := o.b.f.isOpen() && !o.b.f.direct()
				r.v, r.ref, r.m, r.err = t.readOpened(o, pooled)
				if asked {
					ahead.Add(-size)
					select {
					case wake <- struct{}{}:
					default:
					}
				}
				select {
				case results <- r:
				case <-stop:
					r.ref.Release()
					return
				}
				if errors.Is(r.err, tiers.ErrClosed) {
					return
				}
			}
		}()
	}
	go func() {
		readers.Wait()
		close(results)
	}()
	var failed error
	delivered := 0
	for r := range results {
		if errors.Is(r.err, tiers.ErrClosed) {
			failed = tiers.ErrClosed
			r.ref.Release()
			break
		}
		if ctx.Err() != nil {
			r.ref.Release()
			break
		}
		fn(r.i, r.v, r.ref, r.m, r.err)
		delivered++
	}
	if delivered == len(keys) {
		return nil
	}
	close(stop)
	readers.Wait()
	opener.Wait()
	for o := range queue { // opened, and never to be read
		o.b.close(nil)
	}
	for r := range results { // read, and never to be delivered
		r.ref.Release()
	}
	if failed == nil {
		failed = ctx.Err() // the only other reason to stop short
	}
	return fmt.Errorf("ssd: get many: %w", failed)
}

// openAhead looks key up for GetMany ahead of its read: when its block is
// kept in a file, it opens the file and asks the kernel to start reading
// all of it into the page cache, without waiting, unless the file is to be
// read directly (readfile.go).
func (t *Tier) openAhead(key index.Key) opened {
	o := opened{key: key}
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		o.err = tiers.ErrClosed
		return o
	}
	s := t.stripe(key)
	s.RLock()
	o.b.m, o.b.gen, o.err = t.record(key)
	if o.err == nil && o.b.gen != 0 {
		// Either kind of read gets a buffer of the tier's with room for a
		// direct read's rounding (readOpened).
		o.b.f, o.err = t.files.open(key, o.b.gen, int64(o.b.m.Size), true)
	}
	s.RUnlock()
	if o.b.f.isOpen() {
		o.b.f.willNeed(int64(o.b.m.Size))
	}
	return o
}

// readOpened reads the block of o, which openAhead looked up, into a
// buffer of the tier's pool when pooled is set, else a fresh one, and
// closes o's file. An inline block is read as Get reads it.
func (t *Tier) readOpened(o opened, pooled bool) ([]byte, *bufpool.Buffer, index.Header, error) {
	if o.err == nil && !o.b.f.isOpen() {
		if pooled {
			return t.getPooled(o.key)
		}
		v, m, err := t.Get(o.key, nil)
		return v, nil, m, err
	}
	err := o.err
	defer func() { o.b.close(err) }()
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil, nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", o.key, tiers.ErrClosed)
	}
	var v []byte
	var ref *bufpool.Buffer
	if err == nil {
		if pooled {
			ref = t.bufs.Get(int(o.b.m.Size))
			v = ref.Bytes()
		} else {
			v = make([]byte, o.b.m.Size, roundUp(int(o.b.m.Size)))
		}
		if err = readBlock(o.b.f, o.b.m, o.b.gen, v); err != nil {
			ref.Release()
			ref, v = nil, nil
		}
	}
	if err != nil {
		t.dropIfCorrupt(o.key, err)
		return nil, nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", o.key, err)
	}
	return v, ref, o.b.m, nil
}

// pooledIdle bounds the bytes of released buffers the tier keeps for
// GetManyPooled: a few chains' windows of large blocks.
const pooledIdle = 64 << 20

var (
	_ tiers.PooledManyGetter = (*Tier)(nil)
	_ tiers.PooledGetter     = (*Tier)(nil)
)

// GetPooled is Get into a buffer of the tier's pool, returned with one
// reference, which the caller releases once done with the bytes (nil with
// an error, and for an empty block); see tiers.PooledGetter.
func (t *Tier) GetPooled(key index.Key) ([]byte, *bufpool.Buffer, index.Header, error) {
	return t.getPooled(key)
}

// getPooled is Get into a buffer of the tier's pool, returned with one
// reference (nil with an error).
func (t *Tier) getPooled(key index.Key) ([]byte, *bufpool.Buffer, index.Header, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil, nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", key, tiers.ErrClosed)
	}
	var ref *bufpool.Buffer
	b, err := t.locate(key, true)
	if err == nil {
		if b.m.Size > 0 {
			ref = t.bufs.Get(int(b.m.Size))
			if err = b.readInto(ref.Bytes()); err != nil {
				ref.Release()
				ref = nil
			}
		}
		b.close(err)
	}
	if err != nil {
		t.dropIfCorrupt(key, err)
		return nil, nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", key, err)
	}
	return ref.Bytes(), ref, b.m, nil
}

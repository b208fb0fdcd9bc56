package ssd

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
)

// GetMany reads keys' blocks with up to Config.ReadWindow reads in flight,
// and the block files of as many blocks again being read ahead into the
// page cache (posix_fadvise POSIX_FADV_WILLNEED), and calls fn once per key, one call at a time, from the calling
// goroutine, as the reads complete: with the block's bytes (fn's to keep)
// and Header, or the error Get would return for it. Reads start in the
// order of keys, so that the blocks of a chain arrive roughly in order
// while the disk serves several at once. Each block is checked against
// its record as Get checks it, and a corrupt block is dropped and reported
// with an error wrapping tiers.ErrCorrupt. GetMany fails only as a whole:
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

// getMany is GetMany, into pooled buffers when pooled is set.
func (t *Tier) getMany(ctx context.Context, keys []index.Key, pooled bool, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error {
	// t.life is taken by each read, not across the batch: fn may call the
	// tier (the hierarchy reads a block again after an error), and a read
	// lock taken again while Close waits for the lock would deadlock.
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
	// The readers take keys in order from next; a finished read waits in
	// results until fn has had the ones before it, so that at most
	// 2×window blocks are held at once.
	var (
		mu   sync.Mutex
		next int
	)
	claim := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next == len(keys) || ctx.Err() != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	results := make(chan result, window)
	stop := make(chan struct{}) // closed when GetMany gives up early
	var readers sync.WaitGroup
	for range window {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				i, ok := claim()
				if !ok {
					return
				}
				if j := i + window; j < len(keys) {
					t.readAhead(keys[j])
				}
				var r result
				if pooled {
					r.v, r.ref, r.m, r.err = t.getPooled(keys[i])
				} else {
					r.v, r.m, r.err = t.Get(keys[i], nil)
				}
				r.i = i
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
	for r := range results { // read, and never to be delivered
		r.ref.Release()
	}
	if failed == nil {
		failed = ctx.Err() // the only other reason to stop short
	}
	return fmt.Errorf("ssd: get many: %w", failed)
}

// readAhead asks the kernel to start reading key's block file into the
// page cache, when key's block is kept in one, so that the disk works on
// the block a window ahead of the reads GetMany has in flight: each read
// then finds its bytes cached or on their way. Errors are ignored; the
// read itself meets them.
func (t *Tier) readAhead(key index.Key) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return
	}
	s := t.stripe(key)
	s.RLock()
	m, gen, err := t.record(key)
	var f vfs.File
	if err == nil && gen != 0 {
		f, err = t.files.open(key, gen)
	}
	s.RUnlock()
	if err != nil || f == nil {
		return
	}
	willNeed(f, int64(m.Size))
	_ = f.Close()
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
	b, err := t.locate(key)
	if err == nil {
		if b.m.Size > 0 {
			ref = t.bufs.Get(int(b.m.Size))
			if err = b.readInto(ref.Bytes()); err != nil {
				ref.Release()
				ref = nil
			}
		}
		b.close()
	}
	if err != nil {
		t.dropIfCorrupt(key, err)
		return nil, nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", key, err)
	}
	return ref.Bytes(), ref, b.m, nil
}

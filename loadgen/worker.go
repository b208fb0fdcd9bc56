package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// kind is what one request does.
type kind int

const (
	kindPut kind = iota + 1
	kindGet
	kindLookup
)

// worker makes requests one at a time on its own Target. Everything in it
// belongs to its goroutine.
type worker struct {
	id      int
	t       Target // nil after a failed reopen: the worker is out
	dial    Dialer
	content *Content
	cfg     *Config
	rng     *rand.Rand

	keys   []uint64 // the keys of the request being made
	values [][]byte
	res    Result
}

func newWorker(id int, t Target, dial Dialer, content *Content, cfg *Config) *worker {
	return &worker{
		id: id, t: t, dial: dial, content: content, cfg: cfg,
		rng: rand.New(rand.NewPCG(cfg.Seed, uint64(id)+1)),
		res: Result{Latency: new(Histogram), GetLatency: new(Histogram)},
	}
}

// loop makes requests while next hands them out and ctx is live, adding
// each finished one to the shared progress counters.
func (w *worker) loop(ctx context.Context, next func(*worker) (kind, bool), requests, moved *atomic.Int64) {
	for w.t != nil && ctx.Err() == nil {
		k, ok := next(w)
		if !ok {
			return
		}
		start := time.Now()
		blocks, n, err := w.do(ctx, k)
		took := time.Since(start)
		if err != nil && ctx.Err() != nil {
			return // interrupted: neither a result nor an error
		}
		w.res.Requests++
		w.res.Blocks += blocks
		w.res.Bytes += n
		requests.Add(1)
		moved.Add(n)
		if err != nil {
			w.fail(err)
			w.reopen(ctx)
			continue
		}
		w.res.Latency.Record(took)
		if k == kindGet {
			w.res.GetLatency.Record(took)
		}
	}
}

// do makes one request of kind k for w.keys and returns the values it moved
// (or keys it found) and their bytes. Wrong values are counted as they are
// seen; they do not fail the request.
func (w *worker) do(ctx context.Context, k kind) (blocks, n int64, err error) {
	switch k {
	case kindPut:
		w.values = w.values[:0]
		for _, key := range w.keys {
			w.values = append(w.values, w.content.Of(key))
		}
		err = w.t.Put(ctx, w.keys, w.values)
		clear(w.values)
		if err != nil {
			return 0, 0, err
		}
		return int64(len(w.keys)), int64(len(w.keys) * w.content.Size()), nil
	case kindGet:
		err = w.t.Get(ctx, w.keys, func(i int, v []byte, found bool) error {
			switch {
			case !found:
				w.res.Misses++
			case !bytes.Equal(v, w.content.Of(w.keys[i])):
				w.res.Mismatches++
				w.fail(fmt.Errorf("key %d: %d bytes came back that differ from the %d put", w.keys[i], len(v), w.content.Size()))
			default:
				blocks++
				n += int64(len(v))
			}
			return nil
		})
		return blocks, n, err
	case kindLookup:
		found, err := w.t.(Looker).Lookup(ctx, w.keys)
		if err != nil {
			return 0, 0, err
		}
		w.res.Misses += int64(len(w.keys) - found)
		return int64(found), 0, nil
	}
	panic(fmt.Sprintf("loadgen: unknown request kind %d", k))
}

// fail counts an error and keeps the first.
func (w *worker) fail(err error) {
	w.res.Errors++
	if w.res.FirstError == nil {
		w.res.FirstError = err
	}
}

// reopen replaces the target after a failed request, whose connection may
// be unusable; a worker that cannot reopen stops.
func (w *worker) reopen(ctx context.Context) {
	w.t.Close()
	t, err := w.dial(ctx)
	if err != nil {
		w.t = nil
		if ctx.Err() == nil {
			w.fail(fmt.Errorf("worker %d stopped: %w", w.id, err))
		}
		return
	}
	w.t = t
}

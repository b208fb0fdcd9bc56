package kvconn

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
)

// Offload queues blocks to be stored in the background and returns at
// once. Blocks that would take the bytes waiting over
// Config.OffloadQueueBytes are dropped and counted, as are all of them
// after Close. The Conn owns blocks.
func (c *Conn) Offload(ns index.NamespaceID, blocks []sched.Block) {
	c.off.add(ns, blocks)
}

// queued is one block waiting to be offloaded.
type queued struct {
	ns    index.NamespaceID
	block sched.Block
}

// offloader is the goroutine that stores queued blocks, a batch of up to
// Config.OffloadBatch at a time, at the worker's node. A batch that fails
// because the cache is unreachable stays at the head of the queue and is
// tried again after a backoff, one goroutine and one Put at a time, while
// new blocks are dropped once the queue is full; blocks the node refuses
// are dropped.
type offloader struct {
	c    *Conn
	wake chan struct{} // a token when blocks were queued or Close began
	done chan struct{} // closed when run returns

	// ctx ends run's Puts and waits, when Close's time is up.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	queue   []queued
	bytes   int64 // of queue's blocks
	closing bool
	dropped int64         // blocks given up on since New (flush.go)
	empty   chan struct{} // closed while the queue is empty (flush.go)
}

func newOffloader(c *Conn) *offloader {
	ctx, cancel := context.WithCancel(context.Background())
	o := &offloader{c: c, wake: make(chan struct{}, 1), done: make(chan struct{}), ctx: ctx, cancel: cancel, empty: make(chan struct{})}
	close(o.empty)
	go o.run()
	return o
}

// add queues the blocks that fit and drops the others.
func (o *offloader) add(ns index.NamespaceID, blocks []sched.Block) {
	dropped := 0
	o.mu.Lock()
	for _, b := range blocks {
		size := int64(len(b.Data))
		if o.closing || o.bytes+size > o.c.cfg.OffloadQueueBytes {
			dropped++
			continue
		}
		o.queue = append(o.queue, queued{ns, b})
		o.bytes += size
	}
	o.dropped += int64(dropped)
	o.emptied(len(o.queue) == 0)
	o.mu.Unlock()
	o.c.m.dropped.Add(float64(dropped))
	o.signal()
}

func (o *offloader) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// next returns the batch at the head of the queue, waiting for one: up to
// Config.OffloadBatch blocks of one namespace. It returns nil once the
// queue is empty and Close began, or Close's time is up. The batch stays
// queued until remove takes it off.
func (o *offloader) next() (index.NamespaceID, []sched.Block) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ctx.Err() != nil {
		return 0, nil
	}
	for len(o.queue) == 0 {
		if o.closing {
			return 0, nil
		}
		o.mu.Unlock()
		select {
		case <-o.wake:
		case <-o.ctx.Done():
		}
		o.mu.Lock()
		if o.ctx.Err() != nil {
			return 0, nil
		}
	}
	n := 1
	for n < min(len(o.queue), o.c.cfg.OffloadBatch) && o.queue[n].ns == o.queue[0].ns {
		n++
	}
	batch := make([]sched.Block, n)
	for i := range batch {
		batch[i] = o.queue[i].block
	}
	return o.queue[0].ns, batch
}

// remove takes the n blocks at the head of the queue off it.
func (o *offloader) remove(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range o.queue[:n] {
		o.bytes -= int64(len(o.queue[i].block.Data))
		o.queue[i] = queued{} // let the bytes go
	}
	o.queue = o.queue[n:]
	o.emptied(len(o.queue) == 0)
}

func (o *offloader) run() {
	defer close(o.done)
	wait := o.c.cfg.Backoff
	down := false // the last Put failed on an unreachable cache
	for {
		ns, batch := o.next()
		if batch == nil {
			break
		}
		ctx, cancel := context.WithTimeout(o.ctx, o.c.cfg.OffloadTimeout)
		err := o.c.put(ctx, o.c.cfg.Addr, true, ns, batch)
		cancel()
		switch {
		case err == nil:
			if down {
				o.c.cfg.Logger.Info("kvstrata cache is back; offloading again", "addr", o.c.cfg.Addr)
			}
			down, wait = false, o.c.cfg.Backoff
			o.remove(len(batch))
		case o.ctx.Err() != nil: // Close's time is up: dropped below
		case retryable(err):
			o.c.m.errors.WithLabelValues(opOffload).Inc()
			if !down {
				o.c.cfg.Logger.Warn("kvstrata cache unreachable; offloads wait, and are dropped past the queue bound",
					"addr", o.c.cfg.Addr, "err", err)
			}
			down = true
			select {
			case <-time.After(wait):
			case <-o.ctx.Done():
			}
			wait = min(2*wait, o.c.cfg.MaxBackoff)
		default: // refused: the refused blocks are lost
			o.c.m.errors.WithLabelValues(opOffload).Inc()
			dropped := o.refused(ns, batch, err)
			o.c.m.dropped.Add(float64(dropped))
			o.c.cfg.Logger.Warn("kvstrata refused offloaded blocks; dropped", "blocks", dropped, "err", err)
			o.mu.Lock()
			o.dropped += int64(dropped)
			o.mu.Unlock()
			o.remove(len(batch))
		}
	}
	// Close's time is up: what is left is dropped.
	o.mu.Lock()
	left := len(o.queue)
	o.queue, o.bytes = nil, 0
	o.dropped += int64(left)
	o.emptied(true)
	o.mu.Unlock()
	o.c.m.dropped.Add(float64(left))
}

// refused returns how many blocks of a batch the node refused with err.
// A *client.BatchError names them; a batch refused as a whole (one block
// over the node's limits fails the call) is tried again block by block,
// so that only the offending blocks are lost.
func (o *offloader) refused(ns index.NamespaceID, batch []sched.Block, err error) int {
	var be *client.BatchError
	if errors.As(err, &be) {
		n := 0
		for _, e := range be.Errs {
			if e != nil {
				n++
			}
		}
		return n
	}
	if len(batch) == 1 {
		return 1
	}
	n := 0
	for i := range batch {
		ctx, cancel := context.WithTimeout(o.ctx, o.c.cfg.OffloadTimeout)
		if o.c.put(ctx, o.c.cfg.Addr, true, ns, batch[i:i+1]) != nil {
			n++
		}
		cancel()
	}
	return n
}

// retryable reports whether a failed offload may succeed later: the cache
// was unreachable or too slow, not a refusal of the blocks.
func retryable(err error) bool {
	var be *client.BatchError
	if errors.As(err, &be) {
		return false
	}
	return errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// close stops taking blocks, waits up to timeout for the queue to be
// offloaded, then ends the offloader (dropping what is left) and waits
// for it.
func (o *offloader) close(timeout time.Duration) {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	o.signal()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
	case <-t.C:
	}
	o.cancel()
	<-o.done
}

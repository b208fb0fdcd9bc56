//go:build ucx

package ucx

import (
	"context"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/transfer"
)

// The client connection's bookkeeping of its UCX operations: every op a
// request posts is in c.ops until the request settles, so that a failure
// can cancel what is still outstanding and wait for UCX to let go of every
// buffer before the request returns. A request never returns while UCX may
// still read or write memory the caller owns.

// recv returns an op that receives the message tagged tag into buf.
func (c *conn) recv(buf []byte, tag uint64) *op {
	return c.newOp(opRecv, buf, tag)
}

// send returns an op that sends buf tagged tag.
func (c *conn) send(buf []byte, tag uint64) *op {
	return c.newOp(opSend, buf, tag)
}

func (c *conn) newOp(k opKind, buf []byte, tag uint64) *op {
	var o *op
	if n := len(c.free); n > 0 {
		o, c.free = c.free[n-1], c.free[:n-1]
	} else {
		o = new(op)
	}
	o.kind, o.ep, o.buf, o.tag, o.mask, o.msg, o.wk = k, c.ep, buf, tag, fullMask, nil, nil
	o.st, o.n, o.stag, o.dev, o.devLen = 0, 0, 0, 0, 0
	o.done.Store(false)
	return o
}

// post starts ops; from here on they belong to the request.
func (c *conn) post(ctx context.Context, ops ...*op) error {
	c.ops = append(c.ops, ops...)
	c.w.postNow(ops...)
	return nil
}

// wait waits for o and fails the request if o failed.
func (c *conn) wait(ctx context.Context, o *op) error {
	if err := c.waitDone(ctx, o); err != nil {
		return err
	}
	if o.st != ucsOK {
		return c.fail(ctx, o.err())
	}
	return nil
}

// waitDone drives the worker until o is done, or fails the request when
// ctx ends, the connection is closed or the node goes away first.
func (c *conn) waitDone(ctx context.Context, o *op) error {
	if o.done.Load() {
		return nil
	}
	if err := c.w.drive(o.done.Load, func() error { return c.interrupted(ctx) }); err != nil {
		return c.fail(ctx, err)
	}
	return nil
}

// interrupted says why a request must stop waiting, if it must.
func (c *conn) interrupted(ctx context.Context) error {
	switch {
	case c.closed.Load():
		return transfer.ErrClosed
	case c.overLongAgo():
		return errGone
	}
	return ctx.Err()
}

// settle ends a request that went well: it cancels the receives it no
// longer needs (a header posted ahead of a refusal), waits for every op,
// and takes them back for the next request.
func (c *conn) settle(ctx context.Context) error {
	var open bool
	for _, o := range c.ops {
		open = open || !o.done.Load()
	}
	if open {
		c.w.mu.Lock()
		c.w.cancelRecvsLocked(c.ops)
		c.w.mu.Unlock()
	}
	for _, o := range c.ops {
		if err := c.waitDone(ctx, o); err != nil {
			return err
		}
		if o.st != ucsOK && o.st != ucsCanceled {
			return c.fail(ctx, o.err())
		}
	}
	for _, o := range c.ops {
		o.buf = nil // keep no reference to the caller's memory
		c.free = append(c.free, o)
	}
	clear(c.ops)
	c.ops = c.ops[:0]
	return nil
}

// fail marks the connection broken after a failure in the middle of a
// request, tears it down, and returns the request's error.
func (c *conn) fail(ctx context.Context, err error) error {
	what := c.cur.At(c.addr)
	switch {
	case c.closed.Load():
		err = fmt.Errorf("ucx: %v: the connection was closed: %w", what, transfer.ErrClosed)
	case ctx.Err() != nil:
		err = fmt.Errorf("ucx: %v: %w (%w)", what, ctx.Err(), transfer.ErrClosed)
	case c.over():
		err = fmt.Errorf("ucx: %v: the node closed the connection: %w", what, transfer.ErrClosed)
	default:
		err = fmt.Errorf("ucx: %v: %w (%w)", what, err, transfer.ErrClosed)
	}
	c.broken = err
	c.teardown()
	return err
}

// teardown frees the UCX side of the connection: it cancels the receives
// still posted, force-closes the endpoint (which completes the sends and
// the rendezvous in flight on it), waits for UCX to complete the ops (at
// most abortTimeout), and destroys the worker and its context, which ends
// whatever UCX had not completed. When it returns, UCX holds no buffer of
// the connection's.
func (c *conn) teardown() {
	if c.torn {
		return
	}
	c.torn = true
	_ = c.nc.Close()
	ops := append(c.ops, &op{kind: opClose, ep: c.ep})
	c.w.mu.Lock()
	c.w.cancelRecvsLocked(ops)
	c.w.startLocked(ops[len(ops)-1])
	c.w.mu.Unlock()
	deadline := time.Now().Add(abortTimeout)
	stop := func() error {
		if time.Now().After(deadline) {
			return errStopped
		}
		return nil
	}
	_ = c.w.drive(func() bool { return allDone(ops) }, stop)
	// Drop what the node sent that no request will take, rather than
	// have UCX complain of it when the worker goes.
	c.w.mu.Lock()
	drops := c.w.drainStaleLocked(c.id)
	c.w.mu.Unlock()
	_ = c.w.drive(func() bool { return allDone(drops) }, stop)
	c.w.destroy()
	clear(c.ops)
	c.ops, c.free = nil, nil
}

// Lanes returns the UCX transports the connection's endpoint uses.
func (c *conn) Lanes() []Lane {
	c.w.mu.Lock()
	info := c.w.epInfoLocked(c.ep)
	c.w.mu.Unlock()
	return parseLanes(info)
}

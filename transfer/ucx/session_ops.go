//go:build ucx

package ucx

import (
	"time"
)

// The session's bookkeeping of its UCX operations, as conn_ops.go keeps the
// client's: every op it posts is in s.ops until the request settles, and
// nothing it lent UCX goes back to the Handler before UCX let go of it.

func (s *session) send(buf []byte, tag uint64) *op { return s.newOp(opSend, buf, tag) }

func (s *session) recv(buf []byte, tag uint64) *op { return s.newOp(opRecv, buf, tag) }

func (s *session) newOp(k opKind, buf []byte, tag uint64) *op {
	var o *op
	if n := len(s.free); n > 0 {
		o, s.free = s.free[n-1], s.free[:n-1]
	} else {
		o = new(op)
	}
	o.kind, o.ep, o.buf, o.tag, o.mask, o.msg, o.wk = k, s.ep, buf, tag, fullMask, nil, s.wk
	o.st, o.n, o.stag, o.dev, o.devLen = 0, 0, 0, 0, 0
	o.done.Store(false)
	return o
}

// post hands ops to the worker; from here on they belong to the session.
func (s *session) post(ops ...*op) error {
	if len(ops) == 0 {
		return nil
	}
	s.ops = append(s.ops, ops...)
	if err := s.l.w.post(ops...); err != nil {
		for _, o := range ops {
			o.done.Store(true)
			o.st = ucsCanceled
		}
		return err
	}
	return nil
}

// wait waits until o is done, at most IdleTimeout: a client that neither
// sends what it announced nor fetches what it asked for is dropped.
func (s *session) wait(o *op) error {
	deadline := time.Now().Add(s.opts.IdleTimeout)
	for !o.done.Load() {
		if err := s.sleep(deadline); err != nil {
			return err
		}
	}
	return nil
}

// sleep waits for a wake or the deadline; it fails when the session is
// over or the deadline passed.
func (s *session) sleep(deadline time.Time) error {
	if s.gone.Load() {
		return errGone
	}
	d := time.Until(deadline)
	if d <= 0 {
		return errIdle
	}
	s.timer.Reset(d)
	select {
	case <-s.wk:
	case <-s.timer.C:
	}
	s.timer.Stop()
	return nil
}

// settle waits for every op of the request and takes them back.
func (s *session) settle() error {
	for _, o := range s.ops {
		if err := s.wait(o); err != nil {
			return err
		}
		if o.st != ucsOK {
			return o.err()
		}
	}
	for _, o := range s.ops {
		o.buf = nil
		s.free = append(s.free, o)
	}
	clear(s.ops)
	s.ops = s.ops[:0]
	return nil
}

// flush waits, at most abortTimeout, until what the session sent has
// reached the client, so that a drained session's last answer is not cut
// short by the force-close of its endpoint (UCX may hold a send it
// reported complete in its own buffers), and the client sees its socket
// close only once that answer is on its way. The op is nil if the worker
// is stopping; not done if the session was cut or the time ran out.
func (s *session) flush() *op {
	o := &op{kind: opFlush, ep: s.ep, wk: s.wk}
	if s.l.w.post(o) != nil {
		return nil
	}
	deadline := time.Now().Add(abortTimeout)
	for !o.done.Load() && s.sleep(deadline) == nil {
	}
	return o
}

// end frees the session: it stops routing requests to it, cancels its
// receives, force-closes its endpoint (completing its sends), waits for UCX
// to complete every op, drops its stragglers from the unexpected queue,
// and only then releases the blocks it opened and fails the reservations
// it did not commit. Ops UCX does not complete within abortTimeout (see
// there) are parked on the listener with those releases, which run once
// the ops complete, at the latest when the listener's worker is destroyed.
func (s *session) end() {
	var flushed *op
	if s.drained {
		flushed = s.flush()
	}
	s.gone.Store(true)
	_ = s.nc.Close()
	w := s.l.w
	ops := append([]*op(nil), s.ops...)
	if flushed != nil {
		ops = append(ops, flushed)
	}
	if w.call(func() {
		delete(s.l.byID, s.id)
		w.cancelRecvsLocked(ops)
	}) == nil {
		s.mu.Lock()
		ops = append(ops, s.inbox...)
		s.inbox = nil
		s.mu.Unlock()
		closing := &op{kind: opClose, ep: s.ep, wk: s.wk}
		if w.post(closing) == nil {
			ops = append(ops, closing)
		}
		waitAll(s.wk, ops, time.Now().Add(abortTimeout))
		_ = w.do(func() { _ = w.drainStaleLocked(s.id) })
	}
	flights, reserved := s.flights, s.reserved
	s.flights, s.reserved, s.ops, s.free = nil, nil, nil, nil
	s.l.orphan(ops, func() {
		for _, f := range flights {
			if f.release != nil {
				f.release()
			}
		}
		for _, r := range reserved {
			if !r.committed {
				_ = r.commit(false)
			}
		}
	})
}

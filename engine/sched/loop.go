package sched

import (
	"context"
	"errors"
	"slices"
)

// run is the engine loop. Each iteration takes what other goroutines
// handed in (new requests, cancellations, finished onboardings and
// stores, Stats calls), admits waiting requests, and runs one step:
// a Decode of the running decode sequences, then a Prefill of chunks.
// With nothing to compute it sleeps until something is handed in.
func (e *Engine) run() {
	defer close(e.done)
	for {
		in, closed := e.take()
		if closed {
			e.shutdown(in)
			return
		}
		e.handle(in)
		e.admit()
		ran := e.step()
		e.flush()
		e.m.observeState(e)
		if !ran && !e.hasWork() {
			<-e.wake
		}
	}
}

// take empties the inbox.
func (e *Engine) take() (inbox, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	in := e.inbox
	e.inbox = inbox{}
	// Drain a pending wake-up: everything it announced is in hand now.
	select {
	case <-e.wake:
	default:
	}
	return in, e.closed
}

// hasWork reports whether an iteration could do something now without
// anything new handed in: a step, or an admission.
func (e *Engine) hasWork() bool {
	return len(e.running) > 0 || (len(e.waiting) > 0 && e.fits(e.waiting[0]))
}

// handle applies what the inbox brought, in an order that keeps every
// request's Outputs in sequence.
func (e *Engine) handle(in inbox) {
	for _, s := range in.requests {
		e.waiting = append(e.waiting, s)
	}
	for _, r := range in.onboarded {
		e.onboarded(r)
	}
	for _, r := range in.stored {
		e.stored(r)
	}
	for _, s := range in.cancelled {
		e.abort(s, context.Cause(s.ctx))
	}
	if len(in.stats) > 0 {
		st := e.snapshot()
		for _, c := range in.stats {
			c <- st
		}
	}
}

// abort ends s with FinishAbort and err, freeing its blocks; an onboarding
// or store in flight is cancelled and s ends when it returns.
func (e *Engine) abort(s *seq, err error) {
	switch s.phase {
	case phaseDone:
	case phaseOnboarding, phaseStoring:
		if s.abortErr == nil {
			s.abortErr = err
		}
		s.cancelIO()
	case phaseWaiting:
		e.waiting = slices.DeleteFunc(e.waiting, func(w *seq) bool { return w == s })
		e.unqueue(1)
		e.finish(s, FinishAbort, err)
	case phaseRunning:
		e.running = slices.DeleteFunc(e.running, func(r *seq) bool { return r == s })
		e.finish(s, FinishAbort, err)
	}
}

// unqueue counts n requests out of the waiting queue's bound.
func (e *Engine) unqueue(n int) {
	e.mu.Lock()
	e.nWaiting -= n
	e.mu.Unlock()
}

// finish frees s's blocks and sends its last Output.
func (e *Engine) finish(s *seq, reason FinishReason, err error) {
	e.release(s)
	s.phase = phaseDone
	s.stop()
	s.usage.PromptTokens = len(s.req.Prompt)
	s.usage.CompletionTokens = s.generated
	e.m.finished(reason, e.cfg.Now().Sub(s.arrived))
	o := Output{Finish: reason, Err: err, Usage: s.usage}
	if err == nil {
		o.Transfer = s.transfer
	}
	s.emit(o)
	close(s.out)
}

// release gives s's blocks back to the pool.
func (e *Engine) release(s *seq) {
	if !s.holding() {
		return
	}
	if err := e.pool.Free(s.blocks); err != nil {
		// The loop's own bookkeeping is wrong: say so loudly.
		e.log.Error("sched: freeing a request's blocks", "request", s.req.ID, "err", err)
	}
	s.blocks, s.prefix = nil, nil
}

// flush ends the step's event batch.
func (e *Engine) flush() {
	if e.events {
		e.events = false
		e.cfg.Events.Flush()
	}
}

// shutdown aborts every request, once the cache calls in flight (cancelled
// with the engine's context) have returned.
func (e *Engine) shutdown(in inbox) {
	e.io.Wait()
	// Whatever the inbox got after take is in it now: nothing posts once
	// the io goroutines are done and Generate sees closed.
	e.mu.Lock()
	late := e.inbox
	e.inbox = inbox{}
	e.mu.Unlock()
	for _, part := range []inbox{in, late} {
		e.waiting = append(e.waiting, part.requests...)
		for _, c := range part.stats {
			c <- e.snapshot()
		}
	}
	for s := range e.inflight {
		delete(e.inflight, s)
		s.phase = phaseRunning // its io is over: it ends like a running request
		e.running = append(e.running, s)
	}
	for _, s := range e.waiting {
		e.finish(s, FinishAbort, ErrClosed)
	}
	for _, s := range e.running {
		e.finish(s, FinishAbort, ErrClosed)
	}
	e.waiting, e.running = nil, nil
	e.flush()
	e.m.observeState(e)
}

// closing reports whether err is the loop's own context ending.
func (e *Engine) closing(err error) bool {
	return e.ctx.Err() != nil && errors.Is(err, context.Canceled)
}

package frontend

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync/atomic"
	"time"
)

// causeStalled is a migration's cause when the worker's stream went
// silent: connection open, no token in FirstTokenTimeout, or no byte in
// StallTimeout after the first token.
const causeStalled = "stalled"

// stallGuard ends one worker's stream when it stalls: it cancels the
// attempt's context once the worker has sent no token for the first-token
// bound from the request's start, or, after its first token, no byte for
// the stall bound. Its methods are safe for concurrent use.
type stallGuard struct {
	first, idle time.Duration // ≤ 0: no bound
	cancel      context.CancelFunc
	t           *time.Timer
	flowing     atomic.Bool // the first token came: every read re-arms idle
	tripped     atomic.Int64
}

// newStallGuard arms the first-token bound; cancel ends the attempt.
func newStallGuard(first, idle time.Duration, cancel context.CancelFunc) *stallGuard {
	g := &stallGuard{first: first, idle: idle, cancel: cancel}
	g.t = time.AfterFunc(math.MaxInt64, func() {
		if g.flowing.Load() {
			g.tripped.Store(int64(g.idle))
		} else {
			g.tripped.Store(int64(g.first))
		}
		g.cancel()
	})
	g.arm(first)
	return g
}

func (g *stallGuard) arm(d time.Duration) {
	if d > 0 {
		g.t.Reset(d)
	} else {
		g.t.Stop()
	}
}

// hold disarms the guard while a token is handed on: a client slow to
// take it is not a stalled worker.
func (g *stallGuard) hold() { g.t.Stop() }

// token notes that a token from the worker was handed on: from now on the
// stream is bound by its silences.
func (g *stallGuard) token() {
	g.flowing.Store(true)
	g.arm(g.idle)
}

// stop disarms the guard: the attempt is over.
func (g *stallGuard) stop() { g.t.Stop() }

// stalled is the error of a guard that ended its attempt, else nil.
func (g *stallGuard) stalled(worker string) error {
	d := time.Duration(g.tripped.Load())
	switch {
	case d == 0:
		return nil
	case d == g.first && !g.flowing.Load():
		return fmt.Errorf("worker %s stalled: no first token in %v", worker, d)
	default:
		return fmt.Errorf("worker %s stalled: its stream was silent for %v", worker, d)
	}
}

// body is rd, each read of which re-arms the stall bound once the first
// token came.
func (g *stallGuard) body(rd io.Reader) io.Reader { return stallReader{rd, g} }

type stallReader struct {
	rd io.Reader
	g  *stallGuard
}

func (r stallReader) Read(p []byte) (int, error) {
	n, err := r.rd.Read(p)
	if n > 0 && r.g.flowing.Load() {
		r.g.arm(r.g.idle)
	}
	return n, err
}

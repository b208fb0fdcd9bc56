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
// silent, its connection open: see Config.StallTimeout and StallLimit.
const causeStalled = "stalled"

// stallGuard ends one worker's stream when it stalls. The stream's silence
// runs from the request's start until the worker's first token, then from
// its last byte. A silence of the timeout ends the attempt (cancels its
// context) as soon as the worker is also out of the candidates (its health
// checks fail: the process is frozen or gone); a silence of the limit ends
// it whatever the worker's health. Its methods are safe for concurrent use.
type stallGuard struct {
	timeout, limit time.Duration // ≤ 0: none
	poll           time.Duration // how often a silent stream looks at its worker's health
	healthy        func() bool
	cancel         context.CancelFunc
	t              *time.Timer
	since          atomic.Int64 // the silence's start, Unix ns
	flowing        atomic.Bool  // the first token came: every read ends a silence
	tripped        atomic.Int64 // the silence that ended the attempt
}

// newStallGuard starts the silence; cancel ends the attempt.
func newStallGuard(timeout, limit, poll time.Duration, healthy func() bool, cancel context.CancelFunc) *stallGuard {
	g := &stallGuard{timeout: timeout, limit: limit, poll: poll, healthy: healthy, cancel: cancel}
	g.t = time.AfterFunc(math.MaxInt64, g.check)
	g.quiet()
	return g
}

// quiet starts a silence now and arms its first bound.
func (g *stallGuard) quiet() {
	g.since.Store(time.Now().UnixNano())
	g.arm(0)
}

// arm sets the timer for the next bound of a silence that has lasted
// silent, or stops it when no bound is left.
func (g *stallGuard) arm(silent time.Duration) {
	next := time.Duration(math.MaxInt64)
	if g.timeout > 0 {
		if silent < g.timeout {
			next = g.timeout - silent
		} else {
			next = g.poll
		}
	}
	if g.limit > 0 {
		next = min(next, g.limit-silent)
	}
	if next == math.MaxInt64 {
		g.t.Stop()
		return
	}
	g.t.Reset(next)
}

// check runs at each bound: it ends the attempt or re-arms.
func (g *stallGuard) check() {
	silent := time.Duration(time.Now().UnixNano() - g.since.Load())
	if g.limit > 0 && silent >= g.limit || g.timeout > 0 && silent >= g.timeout && !g.healthy() {
		g.tripped.Store(int64(max(silent, 1)))
		g.cancel()
		return
	}
	g.arm(silent)
}

// hold stops the clock while a token is handed on: a client slow to take
// it is not a stalled worker.
func (g *stallGuard) hold() { g.t.Stop() }

// token notes that a token from the worker was handed on: a silence
// starts, and from now on every byte ends one.
func (g *stallGuard) token() {
	g.flowing.Store(true)
	g.quiet()
}

// stop disarms the guard: the attempt is over.
func (g *stallGuard) stop() { g.t.Stop() }

// stalled is the error of a guard that ended its attempt, else nil.
func (g *stallGuard) stalled(worker string) error {
	d := time.Duration(g.tripped.Load()).Round(time.Millisecond)
	switch {
	case d == 0:
		return nil
	case !g.flowing.Load():
		return fmt.Errorf("worker %s stalled: no first token in %v", worker, d)
	default:
		return fmt.Errorf("worker %s stalled: its stream was silent for %v", worker, d)
	}
}

// body is rd, each read of which ends a silence once the first token came.
func (g *stallGuard) body(rd io.Reader) io.Reader { return stallReader{rd, g} }

type stallReader struct {
	rd io.Reader
	g  *stallGuard
}

func (r stallReader) Read(p []byte) (int, error) {
	n, err := r.rd.Read(p)
	if n > 0 && r.g.flowing.Load() {
		r.g.quiet()
	}
	return n, err
}

package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/engine/openai"
	"github.com/kvstrata/kvstrata/engine/sched"
)

// ErrDraining is what a draining worker answers a new request: a 503
// with Retry-After, as vLLM answers while it shuts down, which a router
// takes as "try another worker". It is a sched.ErrClosed; /health says
// it too.
var ErrDraining = fmt.Errorf("worker: draining, taking no new requests: %w", sched.ErrClosed)

// drainPoll is how often Drain looks whether the engine has finished.
const drainPoll = 10 * time.Millisecond

// DrainReport is what a Drain found and did.
type DrainReport struct {
	// InFlight are the requests running or waiting when the drain began;
	// Unfinished those still there when it returned (0 unless ctx ended
	// first).
	InFlight, Unfinished int
	// Offloaded are the blocks the engine handed to the offloader during
	// the drain (the requests that finished computed them).
	Offloaded int
	// Dropped are the blocks given up on since the drain began: over the
	// offload queue's bound, refused by the cache node, or still waiting
	// when ctx ended. 0 means every block the worker computed and queued
	// for the cache reached it.
	Dropped int
	// Took is how long the drain took.
	Took time.Duration
}

// gate turns new requests away once the worker drains, and counts the
// Generate calls on their way into the engine, so that Drain knows when
// every request it let in is in the engine's counts.
type gate struct {
	openai.Engine

	mu       sync.Mutex
	draining bool
	entering int
}

func (g *gate) Generate(ctx context.Context, r sched.Request) (<-chan sched.Output, error) {
	g.mu.Lock()
	if g.draining {
		g.mu.Unlock()
		return nil, ErrDraining
	}
	g.entering++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.entering--
		g.mu.Unlock()
	}()
	return g.Engine.Generate(ctx, r)
}

// close turns new requests away from now on, and reports whether it was
// open.
func (g *gate) close() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	was := !g.draining
	g.draining = true
	return was
}

func (g *gate) closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.draining
}

func (g *gate) pending() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entering
}

// Drain takes the worker out of service without losing what it computed:
// it turns new requests away (ErrDraining: 503, and /health fails), waits
// for the running and waiting requests to finish, then for the offloader
// to store every block they queued in the cache (kvconn.Conn.Flush). It
// returns when that is done or ctx ends, whichever is first, with ctx's
// error in the second case; the report says how many blocks did not reach
// the cache either way. The worker serves no new request after it; Stop
// it next. Call it after a Start that succeeded; a second Drain waits
// again.
func (w *Worker) Drain(ctx context.Context) (DrainReport, error) {
	start := time.Now()
	if w.gate == nil {
		return DrainReport{}, ErrNotServing
	}
	if w.gate.close() {
		w.log.Info("worker draining: taking no new requests")
	}
	dropped0 := 0
	if w.conn != nil {
		dropped0 = w.conn.Dropped()
	}
	st := w.engine.Stats()
	rep := DrainReport{InFlight: st.Running + st.Waiting + st.Onboarding + st.Storing}
	offloaded0 := st.OffloadedBlocks
	var err error
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		st = w.engine.Stats()
		busy := st.Running + st.Waiting + st.Onboarding + st.Storing
		if busy == 0 && w.gate.pending() == 0 {
			break
		}
		select {
		case <-t.C:
			continue
		case <-ctx.Done():
			err = fmt.Errorf("worker: drain: %d requests unfinished: %w", busy, context.Cause(ctx))
			rep.Unfinished = busy
		}
		break
	}
	rep.Offloaded = int(st.OffloadedBlocks - offloaded0)
	if w.conn != nil {
		before := w.conn.Dropped()
		n, ferr := w.conn.Flush(ctx)
		rep.Dropped = before - dropped0 + n
		if err == nil && ferr != nil {
			err = fmt.Errorf("worker: drain: %w", ferr)
		}
	}
	rep.Took = time.Since(start)
	w.log.Info("worker drained", "in_flight", rep.InFlight, "unfinished", rep.Unfinished, "offloaded_blocks", rep.Offloaded,
		"dropped_blocks", rep.Dropped, "took", rep.Took.Round(time.Millisecond), "err", err)
	return rep, err
}

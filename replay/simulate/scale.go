package simulate

import (
	"time"

	"github.com/kvstrata/kvstrata/router/kvindex"
)

// Scaler sizes the simulated deployment while it runs: every
// Config.ScaleInterval of virtual time it is shown the window that just
// ended and answers how many workers it wants, starting ones included.
// The run clamps the answer to [MinWorkers, MaxWorkers]. A Scaler belongs
// to one run: NamedScaler.New makes a fresh one for each.
type Scaler interface {
	Tick(now time.Duration, w Window) (target int)
}

// Window is what one scaling interval [Start, End) saw, as a frontend's
// counters and gauges would: everything a planner.Observation needs.
type Window struct {
	Start, End time.Duration
	// Arrivals are requests that arrived; Finished those that ended,
	// completed or failed.
	Arrivals, Finished int
	// PromptTokens are the arrivals' prompt tokens; CachedTokens the
	// prompt tokens of the requests that finished that a worker's pool or
	// the cache held (known from a request's usage, at its end);
	// OutputTokens the tokens generated.
	PromptTokens, CachedTokens, OutputTokens int64
	// TTFTSum over TTFTCount first tokens, and ITLSum over ITLCount later
	// tokens' gaps, that arrived in the window.
	TTFTSum   time.Duration
	TTFTCount int
	ITLSum    time.Duration
	ITLCount  int
	// QueueDepth is the requests waiting at End: for a worker that is not
	// busy (the router's queue), or in a serving worker's waiting queue.
	QueueDepth int
	// KVUsage is the serving workers' mean GPU pool usage at End, in
	// [0, 1] (vLLM's kv_cache_usage_perc).
	KVUsage float64
	// Serving, Starting and Draining are the workers in each state at End.
	Serving, Starting, Draining int
}

// NamedScaler is one sizing replayed: every policy runs once with it.
type NamedScaler struct {
	// Name is the rows' Scaler.
	Name string
	// Workers is the initial count; 0 takes Config.Workers.
	Workers int
	// New makes the run's Scaler; nil keeps the initial workers all along
	// (static provisioning, no ticks).
	New func() Scaler
}

// workerState is where a worker is in its life: starting (added, not yet
// ready) → serving (a routing candidate) → draining (no new requests,
// finishing its own) → retired (gone from the index, its engine closed;
// what it offloaded stays in the cache). A starting worker scaled down
// is retired at once.
type workerState int

const (
	starting workerState = iota
	serving
	draining
	retired
)

func (s workerState) String() string {
	return [...]string{"starting", "serving", "draining", "retired"}[s]
}

// window accumulates the current scaling interval.
func (r *run) windowReset() { r.win = Window{Start: r.now.Sub(epoch)} }

// tick is a scaling event: the window ends, the scaler answers, the
// deployment moves toward its answer, and the next tick is scheduled.
func (r *run) tick() {
	w := r.win
	w.End = r.now.Sub(epoch)
	w.QueueDepth = len(r.queue)
	for _, x := range r.serving {
		st := x.eng.Stats()
		w.QueueDepth += st.Waiting
		w.KVUsage += st.Pool.Usage
	}
	if len(r.serving) > 0 {
		w.KVUsage /= float64(len(r.serving))
	}
	for _, x := range r.workers {
		switch x.state {
		case serving:
			w.Serving++
		case starting:
			w.Starting++
		case draining:
			w.Draining++
		}
	}
	target := r.scaler.Tick(w.End, w)
	r.windowReset()
	r.scaleTo(min(max(target, r.cfg.MinWorkers), r.cfg.MaxWorkers))
	r.scheduleEvent(event{at: r.now.Add(r.cfg.ScaleInterval), kind: evTick})
}

// scaleTo moves the serving and starting workers toward n: up by adding
// workers that serve after the start-up delay; down by cancelling starting
// workers, newest first, then draining the least loaded serving ones.
func (r *run) scaleTo(n int) {
	var start []*worker
	for _, x := range r.workers {
		if x.state == starting {
			start = append(start, x)
		}
	}
	have := len(r.serving) + len(start)
	switch {
	case n > have:
		r.scaleUps++
		for range n - have {
			w, err := r.addWorker(starting)
			if err != nil {
				r.err = err
				return
			}
			r.scheduleEvent(event{at: r.now.Add(max(r.cfg.StartupDelay, 0)), kind: evReady, w: w})
		}
	case n < have:
		r.scaleDowns++
		k := have - n
		for i := len(start) - 1; i >= 0 && k > 0; i-- {
			r.retire(start[i])
			k--
		}
		for ; k > 0; k-- {
			r.drain(r.leastLoaded())
		}
	}
}

// leastLoaded is the serving worker with the fewest requests, the newest
// of those tied.
func (r *run) leastLoaded() *worker {
	best := r.serving[0]
	for _, w := range r.serving[1:] {
		if len(w.active) <= len(best.active) {
			best = w
		}
	}
	return best
}

// ready makes a starting worker serve and routes what waits.
func (r *run) ready(w *worker) {
	if w.state != starting { // cancelled before it was ready
		return
	}
	w.state = serving
	r.watch(w)
	r.serving = append(r.serving, w)
	r.route()
}

// drain takes w out of the routing candidates at once; it retires when
// its last request ends.
func (r *run) drain(w *worker) {
	w.state = draining
	r.watch(w)
	for i, x := range r.serving {
		if x == w {
			r.serving = append(r.serving[:i], r.serving[i+1:]...)
			break
		}
	}
	r.retireIfDone(w)
}

// retireIfDone retires a draining worker that has nothing left to do.
func (r *run) retireIfDone(w *worker) {
	if w.state == draining && len(w.active) == 0 && !w.scheduled {
		r.retire(w)
	}
}

// retire forgets w: the router's index drops its blocks, its engine
// closes. The blocks it offloaded stay in the cache.
func (r *run) retire(w *worker) {
	w.state = retired
	w.retiredAt = r.now
	_ = r.kv.RemoveWorker(w.id) // registered when added
	w.preemptions = w.eng.Stats().Preemptions
	w.eng.Close()
	w.eng, w.model = nil, nil
	r.held--
	r.watch(w)
}

// watch tells a test's Config.onWorker of w's state.
func (r *run) watch(w *worker) {
	if r.cfg.onWorker != nil {
		r.cfg.onWorker(r.now.Sub(epoch), w.name, w.state)
	}
}

// workerSeconds is every worker's time from its add to its retirement or
// the end of the run, start-up included.
func (r *run) workerSeconds() float64 {
	var s time.Duration
	for _, w := range r.workers {
		end := r.now
		if w.state == retired {
			end = w.retiredAt
		}
		s += end.Sub(w.added)
	}
	return s.Seconds()
}

// workerIDs only grow: a new worker never reuses a retired one's id.
func (r *run) nextID() kvindex.WorkerID { return kvindex.WorkerID(len(r.workers)) }

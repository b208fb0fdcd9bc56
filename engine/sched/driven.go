package sched

// Driven mode: the engine loop without its goroutine, for simulations that
// run many engines deterministically in virtual time (`kvctl replay
// --simulate`). The caller owns the loop: each Step is one iteration of the
// goroutine mode's loop — take what Generate and cancellations handed in,
// admit, run one step, flush the events — and the Connector's calls
// (onboarding's Lookup and Load, a handoff's Store) are made inline, in the
// caller's goroutine, where the goroutine mode makes them in goroutines of
// their own. A simulated Connector then charges the time a restore takes to
// the worker's virtual clock (a sim model's Config.Sleep) instead of
// overlapping it with other requests' steps. Config.Now should read the
// same virtual clock, so that the engine's time stamps are virtual too.
//
// A driven engine is used from one goroutine: Generate, Step, Stats and
// Close are called by the caller in turn, never at once; an Output is on
// its channel when the Step that produced it returns. A request whose
// context is cancelled is aborted at the first Step after the context's
// AfterFunc goroutine has handed the cancellation in, which is not
// synchronous with the cancel call.

// NewDriven returns an engine whose loop the caller runs with Step; Close
// ends it as it ends a goroutine-mode engine.
func NewDriven(cfg Config) (*Engine, error) {
	e, err := build(cfg)
	if err != nil {
		return nil, err
	}
	e.driven = true
	return e, nil
}

// Step runs one iteration of a driven engine's loop and reports whether
// the engine has more to do without anything new handed in: a request
// running, or one waiting that fits. When it reports false, the next Step
// is useful only after a Generate. After Close it does nothing and
// reports false. Step panics on an engine New started, whose loop runs
// in its own goroutine.
func (e *Engine) Step() bool {
	if !e.driven {
		panic("sched: Step on an engine whose loop runs in its own goroutine")
	}
	in, closed := e.take()
	if closed {
		return false
	}
	e.handle(in)
	e.admit()
	e.step()
	e.flush()
	e.m.observeState(e)
	return e.hasWork()
}

// closeDriven is Close for a driven engine: every request not finished
// ends with FinishAbort and ErrClosed.
func (e *Engine) closeDriven() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	in, _ := e.take()
	e.shutdown(in)
	close(e.done)
}

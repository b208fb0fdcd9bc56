package sched

import (
	"slices"

	"github.com/kvstrata/kvstrata/engine/model"
)

// Admission, first come first served: the head of the queue is admitted
// when a batch slot and blocks for its whole sequence so far are free; the
// ones behind it wait their turn. Blocks for the whole sequence are taken
// at once, so that a prefill in chunks never runs out halfway; decode
// takes one more block at a time (see grow).
//
// A request's blocks are, in order: the longest prefix the pool has cached
// (pool.Find), then the blocks kvstrata has (onboarded, see onboard.go),
// then fresh ones to compute. The block holding the last token is always
// computed, for the logits of the next token.

// admit admits waiting requests while they fit.
func (e *Engine) admit() {
	n := 0
	for n < len(e.waiting) && e.fits(e.waiting[n]) {
		s := e.waiting[n]
		n++
		e.start(s)
	}
	if n > 0 {
		e.waiting = slices.Delete(e.waiting, 0, n)
		e.unqueue(n)
	}
}

// fits reports whether s can be admitted now. It counts every block of s
// as needing a free one, though some may be found cached and held by
// another request already: admission is conservative rather than undone.
func (e *Engine) fits(s *seq) bool {
	return len(e.running)+e.onboarding() < e.cfg.MaxNumSeqs && e.pool.NumFree() >= e.blocksFor(len(s.tokens))
}

// onboarding counts the requests onboarding, which hold a batch slot.
func (e *Engine) onboarding() int {
	n := 0
	for s := range e.inflight {
		if s.phase == phaseOnboarding {
			n++
		}
	}
	return n
}

func (e *Engine) blocksFor(tokens int) int { return (tokens + e.bt - 1) / e.bt }

// start takes s's blocks, its cached prefix from the pool, and starts its
// onboarding from kvstrata or puts it in the batch.
func (e *Engine) start(s *seq) {
	if !s.queued {
		s.queued = true
		e.m.queued(e.cfg.Now().Sub(s.arrived))
	}
	hashes := e.ns.Hashes(s.tokens)
	limit := (len(s.tokens) - 1) / e.bt // blocks that may come from a cache
	found := e.pool.Find(e.nsID, hashes[:limit], len(s.tokens))
	rest, err := e.pool.Allocate(e.blocksFor(len(s.tokens)) - len(found))
	if err != nil { // fits said there was room: the loop's bookkeeping is wrong
		e.log.Error("sched: allocating an admitted request's blocks", "request", s.req.ID, "err", err)
		_ = e.pool.Free(found)
		e.finish(s, FinishAbort, err)
		return
	}
	s.blocks = append(found, rest...)
	s.prefix = make([]model.Block, len(s.blocks))
	for i, id := range s.blocks {
		s.prefix[i] = model.Block{Index: i, Layers: e.layers[id]}
	}
	for i := range found {
		s.prefix[i].Tokens, s.prefix[i].Hash = e.bt, hashes[i]
	}
	s.cached = len(found) * e.bt
	s.offloaded = len(found)
	s.prefilled = false
	if !s.everRan {
		s.usage.CachedTokens = s.cached
	}

	// What kvstrata may add: blocks found..to.
	from, to := len(found), limit
	node, lookup, timeout := "", true, e.cfg.CacheTimeout
	if s.remote != nil {
		// Disaggregated decode: the prefill worker named these blocks.
		to = min(limit, len(s.remote))
		node, lookup, timeout = s.req.Transfer.CacheNode, false, e.cfg.TransferTimeout
	}
	if to > from {
		if e.cfg.Connector != nil {
			e.onboard(s, hashes[from:to], from, node, lookup, timeout)
			return
		}
		if s.remote != nil {
			e.counters.RecomputedTokens += uint64((to - from) * e.bt)
		}
	}
	e.toRunning(s)
}

// toRunning puts s in the batch.
func (e *Engine) toRunning(s *seq) {
	s.phase = phaseRunning
	s.everRan = true
	e.running = append(e.running, s)
}

// preempt takes s out of the batch by recompute, as vLLM does: its blocks
// are freed (their cached hashes stay findable until reused) and it goes
// back to the front of the queue, to prefill its prompt and the tokens it
// generated so far when admitted again.
func (e *Engine) preempt(s *seq) {
	e.running = slices.DeleteFunc(e.running, func(r *seq) bool { return r == s })
	e.release(s)
	s.cached, s.prefilled, s.offloaded = 0, false, 0
	s.phase = phaseWaiting
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.mu.Lock()
	e.nWaiting++
	e.mu.Unlock()
	e.counters.Preemptions++
	e.log.Debug("sched: preempted", "request", s.req.ID, "tokens", len(s.tokens))
}

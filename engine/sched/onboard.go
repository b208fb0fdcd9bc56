package sched

import (
	"context"
	"errors"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Onboarding: a request whose prompt has blocks past the pool's prefix
// asks kvstrata for them without holding up the loop. Its blocks are
// allocated; a goroutine (the caller, in driven mode: driven.go) asks the
// Connector how many of the hashes it holds (Lookup; a disaggregated decode skips it, the prefill side named
// them) and loads those straight into the blocks' KV memory (Load), all
// within one timeout; meanwhile the loop runs the other requests. When it
// returns, the loaded blocks count as cached and the request joins the
// batch to compute the rest. Whatever was not loaded — missing, corrupt,
// late, failed — is computed: a cache that is down or slow costs time,
// never a request.

// onboardResult is what an onboarding goroutine hands the loop.
type onboardResult struct {
	s      *seq
	hashes []index.Hash // the blocks asked for, from block from of s
	from   int
	// have is how many of hashes the cache said it holds (all, for a
	// disaggregated decode's named blocks), loaded how many it loaded.
	have, loaded int
	err          error
}

// onboard starts loading hashes into s's blocks from..from+len(hashes).
func (e *Engine) onboard(s *seq, hashes []index.Hash, from int, node string, lookup bool, timeout time.Duration) {
	s.phase = phaseOnboarding
	e.inflight[s] = struct{}{}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	s.cancelIO = cancel
	dst := make([][]byte, len(hashes))
	for i := range dst {
		dst[i] = e.block(s.blocks[from+i])
	}
	conn := e.cfg.Connector
	load := func() onboardResult {
		defer cancel()
		r := onboardResult{s: s, hashes: hashes, from: from, have: len(hashes)}
		if lookup {
			r.have, r.err = conn.Lookup(ctx, e.nsID, hashes)
			r.have = max(0, min(r.have, len(hashes)))
			if r.err != nil {
				r.have = 0
			}
		}
		if r.err == nil && r.have > 0 {
			r.loaded, r.err = conn.Load(ctx, node, e.nsID, hashes[:r.have], func(i int) []byte {
				if i < 0 || i >= r.have {
					return nil
				}
				return dst[i]
			})
			r.loaded = max(0, min(r.loaded, r.have))
		}
		return r
	}
	if e.driven {
		e.onboarded(load())
		return
	}
	e.io.Add(1)
	go func() {
		defer e.io.Done()
		r := load()
		e.post(func(in *inbox) { in.onboarded = append(in.onboarded, r) })
	}()
}

// onboarded takes an onboarding's result: the loaded blocks become cached
// (and findable in the pool), and the request joins the batch.
func (e *Engine) onboarded(r onboardResult) {
	s := r.s
	delete(e.inflight, s)
	s.cancelIO = nil
	if s.abortErr != nil {
		s.phase = phaseRunning // ends like a running request
		e.finish(s, FinishAbort, s.abortErr)
		return
	}
	if r.err != nil {
		e.counters.CacheErrors++
		if errors.Is(r.err, context.DeadlineExceeded) {
			e.log.Debug("sched: onboarding timed out; computing instead", "request", s.req.ID, "loaded", r.loaded, "of", r.have)
		} else {
			e.log.Warn("sched: onboarding failed; computing instead", "request", s.req.ID, "loaded", r.loaded, "of", r.have, "err", r.err)
		}
	}
	n := r.loaded * e.bt
	e.counters.OnboardedTokens += uint64(n)
	e.counters.RecomputedTokens += uint64((r.have - r.loaded) * e.bt)
	for i := range r.loaded {
		p := &s.prefix[r.from+i]
		p.Tokens, p.Hash = e.bt, r.hashes[i]
	}
	s.cached = (r.from + r.loaded) * e.bt
	s.offloaded = r.from + r.loaded
	if !s.everRan {
		s.usage.CachedTokens += n
		s.usage.OnboardedTokens = n
	}
	if _, err := e.pool.Cache(e.nsID, s.blocks, s.tokens[:s.cached]); err != nil {
		e.log.Error("sched: naming onboarded blocks", "request", s.req.ID, "err", err)
	}
	e.toRunning(s)
}

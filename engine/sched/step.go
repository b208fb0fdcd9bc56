package sched

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/index"
)

// One iteration's step, continuous batching as vLLM's scheduler does it:
// every running sequence that is decoding gets its next token (one token
// of the budget each; MaxNumBatchedTokens ≥ MaxNumSeqs, so all of them
// do), then the sequences still prefilling get chunks of what is left of
// MaxNumBatchedTokens, in admission order. The decodes run as one Decode
// call, the chunks as one Prefill call, in that order.
//
// A decode whose next token starts a new block takes one; when the pool
// has none free, the most recently admitted request is preempted (it may
// be the one asking) until one is.

// step runs one iteration's model calls and reports whether it ran any.
func (e *Engine) step() bool {
	budget := e.cfg.MaxNumBatchedTokens
	var dec []*seq
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		if !s.prefilled {
			continue
		}
		if !e.grow(s) {
			break // s itself, the last of the batch, was preempted
		}
		dec = append(dec, s)
		budget--
	}
	var pre []*seq
	var chunk []int
	for _, s := range e.running {
		if s.prefilled || budget == 0 {
			continue
		}
		n := min(len(s.tokens)-s.cached, budget)
		pre, chunk = append(pre, s), append(chunk, n)
		budget -= n
	}
	if len(dec) == 0 && len(pre) == 0 {
		return false
	}
	e.counters.Steps++
	if len(dec) > 0 {
		batch := make([]model.Seq, len(dec))
		for i, s := range dec {
			batch[i] = e.seqOf(s, len(s.tokens))
		}
		res, err := e.cfg.Model.Decode(e.ctx, batch)
		e.apply(dec, batch, res, err)
	}
	if len(pre) > 0 {
		batch := make([]model.Seq, len(pre))
		for i, s := range pre {
			batch[i] = e.seqOf(s, s.cached+chunk[i])
		}
		res, err := e.cfg.Model.Prefill(e.ctx, batch)
		e.apply(pre, batch, res, err)
	}
	e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.phase != phaseRunning })
	return true
}

// grow gives s a block for its next token's KV if it needs one,
// preempting the most recently admitted requests while the pool has none
// free. It reports false when s itself was preempted.
func (e *Engine) grow(s *seq) bool {
	for len(s.blocks)*e.bt < len(s.tokens) {
		if e.pool.NumFree() == 0 {
			victim := e.running[len(e.running)-1]
			e.preempt(victim)
			if victim == s {
				return false
			}
			continue
		}
		ids, err := e.pool.Allocate(1)
		if err != nil {
			panic(fmt.Sprintf("sched: a free block could not be allocated: %v", err))
		}
		s.blocks = append(s.blocks, ids[0])
		s.prefix = append(s.prefix, model.Block{Index: len(s.prefix), Layers: e.layers[ids[0]]})
	}
	return true
}

// seqOf is s as the model sees it, computing tokens cached..upto.
func (e *Engine) seqOf(s *seq, upto int) model.Seq {
	return model.Seq{
		Tokens:      s.tokens[:upto],
		Cached:      s.cached,
		Prefix:      s.prefix[:e.blocksFor(s.cached)],
		Temperature: s.req.Sampling.Temperature,
		Seed:        s.req.Sampling.Seed,
	}
}

// apply takes a step's result: the blocks written go into the arena, full
// blocks are cached in the pool and offloaded, and a sequence that reached
// its end gets its next token.
func (e *Engine) apply(ss []*seq, batch []model.Seq, res model.Result, err error) {
	if err == nil && (len(res.Next) != len(ss) || len(res.Blocks) != len(ss)) {
		err = fmt.Errorf("the model returned %d tokens and %d block lists for %d sequences", len(res.Next), len(res.Blocks), len(ss))
	}
	if err != nil {
		if e.closing(err) {
			return // Close is under way: shutdown ends them
		}
		e.log.Error("sched: model step failed", "sequences", len(ss), "err", err)
		for _, s := range ss {
			e.finish(s, FinishAbort, fmt.Errorf("sched: model step: %w", err))
		}
		return
	}
	now := e.cfg.Now()
	for i, s := range ss {
		for _, b := range res.Blocks[i] {
			if b.Index < 0 || b.Index >= len(s.prefix) {
				continue
			}
			p := &s.prefix[b.Index]
			p.Tokens, p.Hash = b.Tokens, b.Hash
			for l := range min(len(b.Layers), len(p.Layers)) {
				copy(p.Layers[l], b.Layers[l])
			}
		}
		s.cached = len(batch[i].Tokens)
		e.cacheBlocks(s)
		if s.cached == len(s.tokens) {
			s.prefilled = true
			e.produce(s, res.Next[i], now)
		}
	}
}

// produce appends tok to s, sends it, and ends s when it should.
func (e *Engine) produce(s *seq, tok uint32, now time.Time) {
	s.tokens = append(s.tokens, tok)
	s.generated++
	e.counters.GeneratedTokens++
	if s.generated == 1 {
		e.counters.PromptTokens += uint64(len(s.req.Prompt))
		e.m.firstToken(now.Sub(s.arrived))
	} else {
		e.m.nextToken(now.Sub(s.lastToken))
	}
	s.lastToken = now
	s.emit(Output{Tokens: []uint32{tok}})
	var reason FinishReason
	switch {
	case s.stopped(tok):
		reason = FinishStop
	case s.generated >= s.req.MaxTokens:
		reason = FinishLength
	}
	if t := s.req.Transfer; t != nil && t.DoRemoteDecode {
		e.handoff(s, cmpOr(reason, FinishLength))
		return
	}
	if reason != "" {
		e.finish(s, reason, nil)
	}
}

func cmpOr(r, def FinishReason) FinishReason {
	if r == "" {
		return def
	}
	return r
}

// cacheBlocks names s's newly full blocks in the pool and offloads the
// ones s computed itself (a copy: the Connector owns what it is given),
// but for those the pool already had under the same hash: another request
// computed them, and offloaded them then, or they came from kvstrata. A
// disaggregated prefill's blocks are stored by its handoff instead.
func (e *Engine) cacheBlocks(s *seq) {
	full := s.cached / e.bt
	var out []Block
	if from := s.offloaded; full > from {
		s.offloaded = full
		if e.cfg.Connector != nil && (s.req.Transfer == nil || !s.req.Transfer.DoRemoteDecode) {
			for i := from; i < full; i++ {
				if e.pool.Match(e.nsID, []index.Hash{s.prefix[i].Hash}) == 0 {
					out = append(out, e.copyBlock(s, i))
				}
			}
		}
	}
	if _, err := e.pool.Cache(e.nsID, s.blocks, s.tokens[:s.cached]); err != nil {
		e.log.Error("sched: naming a request's full blocks", "request", s.req.ID, "err", err)
	}
	if len(out) > 0 {
		e.counters.OffloadedBlocks += uint64(len(out))
		e.cfg.Connector.Offload(e.nsID, out)
	}
}

// copyBlocks copies s's full blocks from..to out of the arena.
func (e *Engine) copyBlocks(s *seq, from, to int) []Block {
	out := make([]Block, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, e.copyBlock(s, i))
	}
	return out
}

// copyBlock copies s's full block i out of the arena.
func (e *Engine) copyBlock(s *seq, i int) Block {
	b := Block{Hash: s.prefix[i].Hash, Data: slices.Clone(e.block(s.blocks[i]))}
	if i > 0 {
		b.Parent, b.HasParent = s.prefix[i-1].Hash, true
	}
	return b
}

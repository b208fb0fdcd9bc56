package sched

import (
	"context"
	"fmt"

	"github.com/kvstrata/kvstrata/index"
)

// Disaggregated serving through the cache, as vLLM's KV connectors and
// llm-d hand a prompt from a prefill worker to a decode worker with
// kv_transfer_params:
//
//   - DoRemoteDecode (the prefill side): the prompt is prefilled as any
//     other — its cached prefix found in the pool and onboarded from
//     kvstrata — and its first token generated; then every full block of
//     the prompt is copied out of the pool, which frees the request's
//     blocks, and stored with Connector.Store at Transfer.CacheNode (the
//     worker's own cache node if empty), in a goroutine. Only once the
//     store returns does the request end, its last Output's Transfer
//     naming the blocks (DoRemotePrefill set, namespace, hashes) and the
//     node that holds them, always: the decode side loads them from there,
//     never through a directory that may not list them yet (a Raft
//     cluster's lists a block only once its change commits). Without a
//     Connector, or when Store fails, the last Output has ErrTransfer.
//   - DoRemotePrefill (the decode side): Generate checks that the named
//     blocks are the prompt's own (namespace and every hash); on admission
//     they are loaded from Transfer.CacheNode past the pool's own prefix
//     (onboard.go, without a Lookup, within TransferTimeout), and the rest
//     is computed. What was not loaded is computed too, and counted.

// remoteBlocks parses the blocks a decode request's params name and checks
// they are prompt's.
func (e *Engine) remoteBlocks(prompt []uint32, t *KVTransferParams) ([]index.Hash, error) {
	ns, err := index.ParseNamespaceID(t.Namespace)
	if err != nil {
		return nil, fmt.Errorf("%w: kv_transfer_params: %v", ErrBadRequest, err)
	}
	if ns != e.nsID {
		return nil, fmt.Errorf("%w: kv_transfer_params: namespace %v is not this model's %v", ErrBadRequest, ns, e.nsID)
	}
	own := e.ns.Hashes(prompt)
	if len(t.BlockHashes) > len(own) {
		return nil, fmt.Errorf("%w: kv_transfer_params names %d blocks, the prompt has %d full blocks", ErrBadRequest, len(t.BlockHashes), len(own))
	}
	hs := make([]index.Hash, len(t.BlockHashes))
	for i, txt := range t.BlockHashes {
		h, err := index.ParseHash(txt)
		if err != nil {
			return nil, fmt.Errorf("%w: kv_transfer_params: block %d: %v", ErrBadRequest, i, err)
		}
		if h != own[i] {
			return nil, fmt.Errorf("%w: kv_transfer_params: block %d is %v, the prompt's is %v", ErrBadRequest, i, h, own[i])
		}
		hs[i] = h
	}
	return hs, nil
}

// storeResult is what a handoff's store goroutine hands the loop.
type storeResult struct {
	s      *seq
	reason FinishReason
	blocks int
	node   string // where they were stored
	err    error
}

// handoff ends a prefilled DoRemoteDecode request: its prompt's full
// blocks are stored, then it finishes with reason.
func (e *Engine) handoff(s *seq, reason FinishReason) {
	full := len(s.req.Prompt) / e.bt
	blocks := e.copyBlocks(s, 0, full)
	e.release(s)
	hashes := make([]string, full)
	for i, b := range blocks {
		hashes[i] = b.Hash.String()
	}
	node := s.req.Transfer.CacheNode
	params := &KVTransferParams{DoRemotePrefill: true, Namespace: e.nsID.String(), BlockHashes: hashes, CacheNode: node}
	conn := e.cfg.Connector
	if full == 0 { // nothing to hand over: the decode side computes it all
		s.transfer = params
		e.finish(s, reason, nil)
		return
	}
	if conn == nil {
		e.finish(s, FinishAbort, fmt.Errorf("%w: the worker has no cache to store the prompt's blocks in", ErrTransfer))
		return
	}
	s.phase = phaseStoring
	s.transfer = params
	e.inflight[s] = struct{}{}
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.TransferTimeout)
	s.cancelIO = cancel
	store := func() storeResult {
		defer cancel()
		at, err := conn.Store(ctx, node, e.nsID, blocks)
		return storeResult{s: s, reason: reason, blocks: len(blocks), node: at, err: err}
	}
	if e.driven {
		e.stored(store())
		return
	}
	e.io.Add(1)
	go func() {
		defer e.io.Done()
		r := store()
		e.post(func(in *inbox) { in.stored = append(in.stored, r) })
	}()
}

// stored ends a handoff once its blocks are stored.
func (e *Engine) stored(r storeResult) {
	s := r.s
	delete(e.inflight, s)
	s.cancelIO = nil
	switch {
	case s.abortErr != nil:
		e.finish(s, FinishAbort, s.abortErr)
	case r.err != nil:
		e.counters.CacheErrors++
		e.log.Warn("sched: storing a prefilled prompt for remote decode", "request", s.req.ID, "node", s.req.Transfer.CacheNode, "err", r.err)
		e.finish(s, FinishAbort, fmt.Errorf("%w: storing %d blocks at %q: %w", ErrTransfer, r.blocks, s.req.Transfer.CacheNode, r.err))
	default:
		e.counters.StoredBlocks += uint64(r.blocks)
		if r.node != "" {
			s.transfer.CacheNode = r.node
		}
		e.finish(s, r.reason, nil)
	}
}

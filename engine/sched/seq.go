package sched

import (
	"context"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// phase is where a request is in the engine.
type phase uint8

const (
	phaseWaiting    phase = iota // queued for admission
	phaseOnboarding              // blocks allocated, loading from kvstrata
	phaseRunning                 // in the batch: prefilling, then decoding
	phaseStoring                 // prefilled for remote decode, storing its blocks
	phaseDone                    // its last Output is sent
)

// seq is one request inside the engine. Everything but out's receiving end
// belongs to the engine loop; fields set by Generate are read-only after.
type seq struct {
	req Request
	ctx context.Context
	// stop unregisters the request's cancellation callback.
	stop func() bool
	// out carries Outputs, one at most waiting; see emit.
	out chan Output

	// remote is the decode side's named blocks (DoRemotePrefill), checked
	// against the prompt by Generate.
	remote []index.Hash

	phase phase
	// tokens are the prompt, then the generated tokens.
	tokens []uint32
	// blocks is the request's block table; prefix holds, for each of its
	// blocks, what the model reads of it (arena slices, hash when full).
	blocks []pool.BlockID
	prefix []model.Block
	// cached is how many leading tokens have their KV in blocks.
	cached int
	// prefilled: the prefill of the admission's tokens is done and every
	// later step is a decode.
	prefilled bool
	// offloaded counts the leading blocks that need no offload: found in
	// the pool, onboarded, or already handed to the Connector.
	offloaded int
	generated int
	everRan   bool // admitted before: preempted requests are counted once
	usage     Usage

	// abortErr, set while an onboarding or store is in flight, aborts the
	// request when it completes.
	abortErr error
	// cancelIO cancels the onboarding or store in flight.
	cancelIO context.CancelFunc
	// transfer is the last Output's Transfer (DoRemoteDecode).
	transfer *KVTransferParams

	arrived, lastToken time.Time
	queued             bool // queue time observed
}

// emit hands o to the reader without blocking: if the reader has not taken
// the Output before, it is taken back and merged with o, its tokens first.
// Only the engine loop sends, so the loop ends at the first send that finds
// room, which a reader only ever makes.
func (s *seq) emit(o Output) {
	for {
		select {
		case s.out <- o:
			return
		default:
		}
		select {
		case old := <-s.out:
			o.Tokens = append(old.Tokens, o.Tokens...)
		default:
		}
	}
}

// stopped reports whether tok ends the request's generation.
func (s *seq) stopped(tok uint32) bool {
	return !s.req.IgnoreEOS && slices.Contains(s.req.StopTokens, tok)
}

// holding reports whether the request holds pool blocks.
func (s *seq) holding() bool { return len(s.blocks) > 0 }

// Package model is what a worker's engine loop needs from a model: the
// layout of its KV cache, and two steps over a batch of sequences —
// prefill, which computes the KV of each sequence's uncached tokens, and
// decode, which computes one more token per sequence.
//
// Two backends implement Model: engine/model/sim, which costs time and
// derives its KV bytes from the blocks' names, and (to come) tiny, a real
// transformer whose KV bytes are real K/V tensors. The engine loop owns
// scheduling, the block pool and the cache; a model only computes.
//
// # KV bytes
//
// A block's KV is held per layer: Block.Layers[l] is layer l's K and V for
// the block's tokens, Layout.LayerBytes() bytes, laid out as
//
//	K[token][kv_head][head_dim] ‖ V[token][kv_head][head_dim]
//
// with each element Layout.DTypeBytes bytes, little-endian, tokens in
// sequence order and BlockTokens rows of each (rows past a partial block's
// Tokens are zero). The concatenation of a block's layers, layer 0 first, is
// the value stored in kvstrata under the block's key, so
// index.Namespace.BlockBytes() equals Layout.BlockBytes() where the dtype is
// one index knows.
//
// A Model is safe for use by one engine loop: steps are not called
// concurrently with one another.
package model

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Model is one worker's model, as its engine loop drives it.
type Model interface {
	// Layout is the model's KV layout; it does not change.
	Layout() Layout
	// Prefill computes the KV of Tokens[Cached:] of each sequence of the
	// batch as one forward pass and samples each sequence's next token. A
	// sequence's cached prefix costs nothing.
	Prefill(ctx context.Context, batch []Seq) (Result, error)
	// Decode is a decode step: each sequence of the batch has one uncached
	// token (len(Tokens) == Cached+1), whose KV is computed and after which
	// the next token is sampled.
	Decode(ctx context.Context, batch []Seq) (Result, error)
}

// Seq is one sequence of a batch.
type Seq struct {
	// Tokens are the sequence's token ids so far: prompt, then generated.
	Tokens []uint32
	// Cached is how many leading tokens already have their KV (in the
	// worker's pool, restored from kvstrata, or computed by an earlier
	// chunk); 0 ≤ Cached < len(Tokens).
	Cached int
	// Prefix is the KV of Tokens[:Cached]: one Block per block, in order,
	// the last partial when Cached is not a multiple of BlockTokens. A
	// backend computing real attention reads it; sim reads only the Hash
	// of the block before the first one the step writes, to continue the
	// hash chain without rehashing the prefix, and a nil Prefix is fine
	// there.
	Prefix []Block
	// Temperature and Seed choose the next token: 0 is greedy (argmax);
	// above 0 the token is sampled from softmax(logits/Temperature) by a
	// generator seeded from (Seed, len(Tokens)), so that a sequence's
	// output depends neither on how its steps were batched nor on where
	// its prefix's KV came from. A backend without logits may ignore them.
	Temperature float64
	Seed        uint64
}

// Block is the KV of one block of a sequence.
type Block struct {
	// Index is the block's position in its sequence, from 0.
	Index int
	// Tokens is how many of the block's BlockTokens rows are filled.
	Tokens int
	// Hash is the block's chained hash (index.Namespace.Hashes) when the
	// block is full, else 0.
	Hash index.Hash
	// Layers holds one slice of Layout.LayerBytes() per layer (see the
	// package doc). A backend with no tensors leaves it nil for a partial
	// block.
	Layers [][]byte
}

// Full reports whether the block holds BlockTokens tokens.
func (b Block) Full(l Layout) bool { return b.Tokens == l.Namespace.BlockTokens }

// Result is what one step produced.
type Result struct {
	// Took is the step's compute time: modelled by sim (after its
	// speedup), measured by a real backend.
	Took time.Duration
	// Next is each sequence's next token, in batch order.
	Next []uint32
	// Blocks is, per sequence in batch order, the KV of the blocks the
	// step wrote: from the block holding token Cached to the last one,
	// which is partial unless the sequence ends on a block boundary. The
	// full ones are what the engine offloads to kvstrata.
	Blocks [][]Block
}

// Layout is a model's KV layout within its namespace.
type Layout struct {
	// Namespace is the family of blocks the model reads and writes: model
	// name, layers, KV heads, head dim, dtype and block size.
	Namespace index.Namespace
	// DTypeBytes is the width of one K or V element in bytes, > 0.
	DTypeBytes int
}

// ErrBadLayout marks a layout that fails Validate.
var ErrBadLayout = errors.New("model: bad layout")

// Validate reports what is wrong with l, wrapping ErrBadLayout, or nil.
func (l Layout) Validate() error {
	if err := l.Namespace.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadLayout, err)
	}
	if l.DTypeBytes <= 0 {
		return fmt.Errorf("%w: dtype bytes is %d, must be > 0", ErrBadLayout, l.DTypeBytes)
	}
	if n := l.Namespace.BlockBytes(); n != 0 && n != l.BlockBytes() {
		return fmt.Errorf("%w: dtype bytes %d does not match dtype %q", ErrBadLayout, l.DTypeBytes, l.Namespace.Layout.DType)
	}
	return nil
}

// TokenLayerBytes is the KV bytes of one token in one layer:
// 2 (K and V) · KV heads · head dim · dtype bytes.
func (l Layout) TokenLayerBytes() int {
	return 2 * l.Namespace.Layout.KVHeads * l.Namespace.Layout.HeadDim * l.DTypeBytes
}

// LayerBytes is the KV bytes of one block in one layer.
func (l Layout) LayerBytes() int { return l.TokenLayerBytes() * l.Namespace.BlockTokens }

// BlockBytes is the KV bytes of one block, all layers.
func (l Layout) BlockBytes() int { return l.LayerBytes() * l.Namespace.Layout.Layers }

// ErrBadBatch marks a batch a model refuses: a sequence with nothing to
// compute, a Cached out of range, an empty batch, a decode sequence with more than one
// uncached token.
var ErrBadBatch = errors.New("model: bad batch")

// CheckBatch reports an empty batch or the first sequence of batch that
// breaks Seq's rules, wrapping ErrBadBatch; decode also requires one
// uncached token each.
func CheckBatch(batch []Seq, decode bool) error {
	if len(batch) == 0 {
		return fmt.Errorf("%w: empty batch", ErrBadBatch)
	}
	for i, s := range batch {
		if s.Cached < 0 || s.Cached >= len(s.Tokens) {
			return fmt.Errorf("%w: sequence %d: cached is %d, must be in [0, %d)", ErrBadBatch, i, s.Cached, len(s.Tokens))
		}
		if decode && len(s.Tokens)-s.Cached != 1 {
			return fmt.Errorf("%w: sequence %d: decode needs 1 uncached token, has %d", ErrBadBatch, i, len(s.Tokens)-s.Cached)
		}
	}
	return nil
}

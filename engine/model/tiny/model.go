// Package tiny is a real decoder-only transformer in pure Go, float32 on
// the CPU: token embedding, RMSNorm, rotary position embedding (RoPE),
// grouped-query attention, a SwiGLU MLP, a final RMSNorm and an output
// projection tied to the embedding; greedy and temperature sampling. Its
// weights come from a seed (see weights.go) or a safetensors file (see
// safetensors.go); seeded ones are not trained, so its text is noise, but
// its arithmetic is a transformer's, and its KV cache is real K/V tensors
// in model.go's per-block layout (see kv.go).
//
// What it is for: the correctness of KV reuse. A prompt whose prefix KV is
// restored (Seq.Prefix: from the worker's pool, from kvstrata, from another
// worker) gives bit-identical logits and tokens to a full recompute, for
// any split point, any chunking of the prefill and any batch around it:
// every token's K/V and outputs are computed from its own inputs by the
// same kernels in a fixed order (see forward.go and math.go).
//
// Cost: a token costs about Layers·(2·Dim·(Heads+KVHeads)·HeadDim +
// 3·Dim·Hidden) multiply-adds plus attention over its position, and each
// sequence's sampled token Vocab·Dim more (the output projection); see
// BenchmarkPrefill and BenchmarkDecode.
//
// A Model is used by one engine loop at a time, as model.Model says; a
// step spreads its rows over Config.Workers goroutines.
package tiny

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/index"
)

// Model is the tiny transformer.
type Model struct {
	cfg    Config
	layout model.Layout
	w      *weights
	rope   ropeTable
}

var _ model.Model = (*Model)(nil)

// New returns a tiny model of cfg, its zero fields defaulted, with
// weights generated from cfg.Seed, or read from cfg.Weights (errors wrap
// ErrBadWeights). With the default config that takes about 0.2 s of CPU
// and 49 MiB of heap, nearly all the embedding.
func New(cfg Config) (*Model, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := model.Layout{
		Namespace: index.Namespace{
			Model: cfg.Model,
			Layout: index.KVLayout{
				Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: "fp32", TPSize: 1,
			},
			BlockTokens: cfg.BlockTokens,
		},
		DTypeBytes: 4,
	}
	err := l.Validate()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	var w *weights
	if cfg.Weights == "" {
		w = seededWeights(cfg)
	} else if w, err = readSafetensors(cfg.Weights, cfg); err != nil {
		return nil, err
	}
	return &Model{cfg: cfg, layout: l, w: w, rope: newRope(cfg.ContextLen, cfg.HeadDim, cfg.RopeTheta)}, nil
}

// Layout is the model's KV layout: fp32 (4 bytes), Layers layers, KVHeads
// KV heads of HeadDim.
func (m *Model) Layout() model.Layout { return m.layout }

// Config is the model's config, defaults filled in.
func (m *Model) Config() Config { return m.cfg }

// Prefill computes the KV of each sequence's Tokens[Cached:], reading the
// cached positions' KV from its Prefix, and samples its next token.
// Result.Blocks holds the blocks from the one holding token Cached on,
// the first with its cached rows too. A Prefix that does not hold the
// Cached tokens' KV in the model's layout (block count, indexes, layer
// count or sizes) is refused with model.ErrBadBatch; its contents are not
// checked (the engine checks what it restores).
func (m *Model) Prefill(ctx context.Context, batch []model.Seq) (model.Result, error) {
	res, _, err := m.step(ctx, batch, false)
	return res, err
}

// Decode is Prefill of one new token per sequence.
func (m *Model) Decode(ctx context.Context, batch []model.Seq) (model.Result, error) {
	res, _, err := m.step(ctx, batch, true)
	return res, err
}

// PrefillLogits is Prefill that also returns, per sequence in batch order,
// the logits (Vocab of them) its next token was sampled from, for tests
// and tools comparing runs bit for bit.
func (m *Model) PrefillLogits(ctx context.Context, batch []model.Seq) (model.Result, [][]float32, error) {
	return m.step(ctx, batch, false)
}

// DecodeLogits is Decode that also returns the logits, as PrefillLogits.
func (m *Model) DecodeLogits(ctx context.Context, batch []model.Seq) (model.Result, [][]float32, error) {
	return m.step(ctx, batch, true)
}

func (m *Model) step(ctx context.Context, batch []model.Seq, decode bool) (model.Result, [][]float32, error) {
	if err := m.check(batch, decode); err != nil {
		return model.Result{}, nil, err
	}
	start := time.Now()
	logits, kvs, err := m.forward(ctx, batch)
	if err != nil {
		return model.Result{}, nil, err
	}
	res := model.Result{Next: make([]uint32, len(batch)), Blocks: make([][]model.Block, len(batch))}
	for i, s := range batch {
		res.Next[i] = sample(logits[i], s)
		res.Blocks[i] = m.blocks(s, kvs[i])
	}
	res.Took = time.Since(start)
	return res, logits, nil
}

// check refuses, wrapping model.ErrBadBatch, what model.CheckBatch does,
// and a sequence over the context length, a token past the vocabulary, a
// temperature that is negative or not finite, or a malformed Prefix.
func (m *Model) check(batch []model.Seq, decode bool) error {
	if err := model.CheckBatch(batch, decode); err != nil {
		return err
	}
	for i, s := range batch {
		if len(s.Tokens) > m.cfg.ContextLen {
			return fmt.Errorf("%w: sequence %d has %d tokens, the context length is %d", model.ErrBadBatch, i, len(s.Tokens), m.cfg.ContextLen)
		}
		for j, t := range s.Tokens {
			if int64(t) >= int64(m.cfg.Vocab) {
				return fmt.Errorf("%w: sequence %d: token %d is %d, the vocabulary has %d", model.ErrBadBatch, i, j, t, m.cfg.Vocab)
			}
		}
		if !(s.Temperature >= 0) || math.IsInf(s.Temperature, 0) {
			return fmt.Errorf("%w: sequence %d: temperature is %v, must be finite and ≥ 0", model.ErrBadBatch, i, s.Temperature)
		}
		if err := m.checkPrefix(i, s); err != nil {
			return err
		}
	}
	return nil
}

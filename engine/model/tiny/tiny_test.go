package tiny

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
)

// small is the config tests use: the model's full structure (2 layers,
// grouped-query attention with 2 query heads per KV head) at a size that
// keeps tests fast under -race; blocks of 4 tokens so that short prompts
// span several blocks.
func small() Config {
	return Config{Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, Hidden: 64, Vocab: 512, BlockTokens: 4, ContextLen: 256, Workers: 3}
}

func newModel(t testing.TB, cfg Config) *Model {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func prompt(n int, salt uint64) []uint32 {
	r := rand.New(rand.NewPCG(salt, 7))
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(r.IntN(512))
	}
	return toks
}

// run is one step that must succeed; it returns the result and logits.
func run(t testing.TB, m *Model, batch ...model.Seq) (model.Result, [][]float32) {
	t.Helper()
	res, logits, err := m.PrefillLogits(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	return res, logits
}

// stored is what kvstrata would hand back for blocks: each block's layers
// concatenated into one value, then cut again, so that no slice of the
// producer's is shared with the reader.
func stored(blocks []model.Block) []model.Block {
	out := make([]model.Block, len(blocks))
	for i, b := range blocks {
		value := bytes.Join(b.Layers, nil)
		n := len(value) / len(b.Layers)
		b.Layers = make([][]byte, len(b.Layers))
		for l := range b.Layers {
			b.Layers[l] = value[l*n : (l+1)*n]
		}
		out[i] = b
	}
	return out
}

// prefixAt is the Prefix of tokens[:c] as an engine holds it: the blocks
// of a prefill of tokens[:c], through storage.
func prefixAt(t testing.TB, m *Model, tokens []uint32, c int) []model.Block {
	t.Helper()
	if c == 0 {
		return nil
	}
	res, _ := run(t, m, model.Seq{Tokens: tokens[:c]})
	return stored(res.Blocks[0])
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func blocksEqual(a, b []model.Block) bool {
	return slices.EqualFunc(a, b, func(x, y model.Block) bool {
		return x.Index == y.Index && x.Tokens == y.Tokens && x.Hash == y.Hash &&
			slices.EqualFunc(x.Layers, y.Layers, bytes.Equal)
	})
}

func TestRestoredPrefixGivesBitIdenticalLogitsAtEverySplit(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(23, 1) // 5 full blocks of 4 and a partial one of 3
	full, want := run(t, m, model.Seq{Tokens: toks})
	for c := 1; c < len(toks); c++ {
		res, got := run(t, m, model.Seq{Tokens: toks, Cached: c, Prefix: prefixAt(t, m, toks, c)})
		if !sameBits(got[0], want[0]) || res.Next[0] != full.Next[0] {
			t.Errorf("split at %d: logits or next token differ from a full recompute", c)
		}
		if !blocksEqual(res.Blocks[0], full.Blocks[0][c/4:]) {
			t.Errorf("split at %d: the blocks written differ from a full recompute's from block %d on", c, c/4)
		}
	}
}

func TestPrefixFromALongerSequencesBlocksIsReadOnlyUpToCached(t *testing.T) {
	// A partial last block may come with more rows than Cached (a block of
	// another sequence sharing the prefix); only the cached rows are read.
	m := newModel(t, small())
	toks := prompt(14, 2)
	full, want := run(t, m, model.Seq{Tokens: toks})
	other := append(slices.Clone(toks[:10]), 1, 2, 3, 4, 5)
	res, _ := run(t, m, model.Seq{Tokens: other})
	prefix := stored(res.Blocks[0][:3]) // tokens 0…11 of other, of which 0…9 are shared
	got, logits := run(t, m, model.Seq{Tokens: toks, Cached: 10, Prefix: prefix})
	if !sameBits(logits[0], want[0]) || got.Next[0] != full.Next[0] || !blocksEqual(got.Blocks[0], full.Blocks[0][2:]) {
		t.Error("restoring 10 tokens from blocks holding 12 gave other logits or blocks than a full recompute")
	}
}

// chunked prefills toks in chunks of the given sizes, as an engine loop
// does: each chunk's Prefix is the blocks written so far (the last partial
// block replaced by the newer one), through storage.
func chunked(t testing.TB, m *Model, toks []uint32, sizes []int) (model.Result, []float32, []model.Block) {
	t.Helper()
	var have []model.Block
	var res model.Result
	var logits [][]float32
	c := 0
	for _, n := range sizes {
		res, logits = run(t, m, model.Seq{Tokens: toks[:c+n], Cached: c, Prefix: stored(have)})
		have = append(have[:c/m.cfg.BlockTokens], res.Blocks[0]...)
		c += n
	}
	return res, logits[0], have
}

func TestChunkedPrefillEqualsOnePass(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(26, 3)
	full, want := run(t, m, model.Seq{Tokens: toks})
	ones := make([]int, 26)
	for i := range ones {
		ones[i] = 1
	}
	for _, sizes := range [][]int{ones, {4, 4, 4, 4, 4, 4, 2}, {3, 5, 7, 11}, {1, 24, 1}, {13, 13}, {25, 1}} {
		res, logits, blocks := chunked(t, m, toks, sizes)
		if !sameBits(logits, want[0]) || res.Next[0] != full.Next[0] {
			t.Errorf("chunks %v: logits or next token differ from one pass", sizes)
		}
		if !blocksEqual(blocks, full.Blocks[0]) {
			t.Errorf("chunks %v: the blocks differ from one pass's", sizes)
		}
	}
}

func TestBatchCompositionDoesNotChangeAnySequence(t *testing.T) {
	m := newModel(t, small())
	a, b, c := prompt(19, 4), prompt(7, 5), prompt(30, 6)
	seqA := model.Seq{Tokens: a, Cached: 9, Prefix: prefixAt(t, m, a, 9)}
	seqB := model.Seq{Tokens: b, Temperature: 0.8, Seed: 42}
	seqC := model.Seq{Tokens: c, Cached: 16, Prefix: prefixAt(t, m, c, 16)}
	alone := map[string][]float32{}
	var next = map[string]uint32{}
	for name, s := range map[string]model.Seq{"a": seqA, "b": seqB, "c": seqC} {
		res, l := run(t, m, s)
		alone[name], next[name] = l[0], res.Next[0]
	}
	one := newModel(t, func() Config { c := small(); c.Workers = 1; return c }())
	for _, tc := range []struct {
		m     *Model
		names string
		batch []model.Seq
	}{
		{m, "abc", []model.Seq{seqA, seqB, seqC}},
		{m, "cba", []model.Seq{seqC, seqB, seqA}},
		{m, "bab", []model.Seq{seqB, seqA, seqB}},
		{one, "acb", []model.Seq{seqA, seqC, seqB}},
	} {
		res, logits := run(t, tc.m, tc.batch...)
		for i, name := range tc.names {
			if !sameBits(logits[i], alone[string(name)]) || res.Next[i] != next[string(name)] {
				t.Errorf("batch %s (workers %d): sequence %c differs from its run alone", tc.names, tc.m.cfg.Workers, name)
			}
		}
	}
}

// decodeN prefills s, then decodes n tokens greedily, feeding back the
// blocks; it returns the tokens and each step's logits.
func decodeN(t testing.TB, m *Model, s model.Seq, n int) ([]uint32, [][]float32) {
	t.Helper()
	ctx := context.Background()
	res, logits, err := m.PrefillLogits(ctx, []model.Seq{s})
	if err != nil {
		t.Fatal(err)
	}
	have := append(s.Prefix[:s.Cached/m.cfg.BlockTokens:s.Cached/m.cfg.BlockTokens], res.Blocks[0]...)
	toks := slices.Clone(s.Tokens)
	var out []uint32
	var steps [][]float32
	for range n {
		out = append(out, res.Next[0])
		steps = append(steps, logits[0])
		toks = append(toks, res.Next[0])
		c := len(toks) - 1
		res, logits, err = m.DecodeLogits(ctx, []model.Seq{{Tokens: toks, Cached: c, Prefix: stored(have)}})
		if err != nil {
			t.Fatal(err)
		}
		have = append(have[:c/m.cfg.BlockTokens], res.Blocks[0]...)
	}
	return out, steps
}

func TestDecodeAfterRestoredPrefillEqualsDecodeAfterFullPrefill(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(17, 7)
	want, wantLogits := decodeN(t, m, model.Seq{Tokens: toks}, 12)
	for _, c := range []int{4, 9, 16} {
		got, logits := decodeN(t, m, model.Seq{Tokens: toks, Cached: c, Prefix: prefixAt(t, m, toks, c)}, 12)
		if !slices.Equal(got, want) {
			t.Errorf("restored at %d: decoded %v, full prefill decoded %v", c, got, want)
		}
		for i := range logits {
			if !sameBits(logits[i], wantLogits[i]) {
				t.Errorf("restored at %d: step %d's logits differ", c, i)
			}
		}
	}
}

func TestGreedyIsArgmaxAndDeterministic(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(11, 8)
	res, logits := run(t, m, model.Seq{Tokens: toks})
	best := 0
	for i, v := range logits[0] {
		if v > logits[0][best] {
			best = i
		}
	}
	if res.Next[0] != uint32(best) {
		t.Errorf("greedy chose %d, the argmax is %d", res.Next[0], best)
	}
	again := newModel(t, small()) // same seed, same weights
	got, l2 := run(t, again, model.Seq{Tokens: toks})
	if got.Next[0] != res.Next[0] || !sameBits(l2[0], logits[0]) {
		t.Error("two models of the same config disagree")
	}
	other := newModel(t, func() Config { c := small(); c.Seed = 2; return c }())
	if _, l3 := run(t, other, model.Seq{Tokens: toks}); sameBits(l3[0], logits[0]) {
		t.Error("another seed gives the same logits")
	}
}

func TestTemperatureSamplingIsReproducibleBySeed(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(9, 9)
	seen := map[uint32]bool{}
	for seed := range uint64(20) {
		s := model.Seq{Tokens: toks, Temperature: 1.5, Seed: seed}
		a, _ := run(t, m, s)
		b, _ := run(t, m, model.Seq{Tokens: []uint32{1, 2}}, model.Seq{Tokens: toks, Cached: 5, Prefix: prefixAt(t, m, toks, 5), Temperature: 1.5, Seed: seed})
		if a.Next[0] != b.Next[1] {
			t.Errorf("seed %d: sampled %d alone from scratch, %d batched after a restore", seed, a.Next[0], b.Next[1])
		}
		seen[a.Next[0]] = true
	}
	if len(seen) < 5 {
		t.Errorf("20 seeds at temperature 1.5 sampled only %d distinct tokens of 512", len(seen))
	}
	// The generator is seeded by (Seed, len(Tokens)): the same seed at
	// another length is another draw, so a sequence does not repeat itself.
	if sample(flat(512), model.Seq{Tokens: make([]uint32, 3), Temperature: 1, Seed: 1}) ==
		sample(flat(512), model.Seq{Tokens: make([]uint32, 4), Temperature: 1, Seed: 1}) {
		t.Error("the same seed at two lengths drew the same token from a flat distribution")
	}
}

func flat(n int) []float32 { return make([]float32, n) }

func TestActivationsStayFiniteOverALongPrompt(t *testing.T) {
	cfg := small()
	m := newModel(t, cfg)
	toks := prompt(cfg.ContextLen, 10)
	res, logits := run(t, m, model.Seq{Tokens: toks})
	var sum, sq float64
	for _, v := range logits[0] {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %v over %d tokens", v, len(toks))
		}
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	n := float64(len(logits[0]))
	if sd := math.Sqrt(sq/n - (sum/n)*(sum/n)); !(sd > 0.05 && sd < 50) {
		t.Errorf("logits' standard deviation is %v over %d tokens: not a sane scale", sd, len(toks))
	}
	for _, b := range res.Blocks[0] {
		for _, lay := range b.Layers {
			for i := 0; i < len(lay); i += 4 {
				if v := math.Float32frombits(uint32(lay[i]) | uint32(lay[i+1])<<8 | uint32(lay[i+2])<<16 | uint32(lay[i+3])<<24); math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("block %d holds a K/V element %v", b.Index, v)
				}
			}
		}
	}
}

func TestBlocksFollowTheDocumentedLayout(t *testing.T) {
	m := newModel(t, small())
	l := m.Layout()
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	ns := l.Namespace
	if ns.Layout.DType != "fp32" || l.DTypeBytes != 4 || ns.BlockBytes() != l.BlockBytes() {
		t.Fatalf("dtype %q of %d bytes: namespace block bytes %d, layout %d", ns.Layout.DType, l.DTypeBytes, ns.BlockBytes(), l.BlockBytes())
	}
	if want := 2 * 2 * 8 * 4 * 4; l.LayerBytes() != want { // K and V · 2 KV heads · head dim 8 · 4 bytes · 4 tokens
		t.Errorf("layer bytes %d, want %d", l.LayerBytes(), want)
	}
	toks := prompt(10, 11)
	res, _ := run(t, m, model.Seq{Tokens: toks})
	bs := res.Blocks[0]
	if len(bs) != 3 || bs[2].Tokens != 2 || bs[2].Hash != 0 {
		t.Fatalf("10 tokens gave %d blocks, the last of %d tokens with hash %x; want 3, the last partial with 2 and no hash", len(bs), bs[len(bs)-1].Tokens, bs[len(bs)-1].Hash)
	}
	hashes := ns.Hashes(toks)
	for i, b := range bs {
		if b.Index != i || len(b.Layers) != 2 {
			t.Errorf("block %d: index %d, %d layers", i, b.Index, len(b.Layers))
		}
		if i < 2 && b.Hash != hashes[i] {
			t.Errorf("block %d's hash is not the namespace's chained hash", i)
		}
		for _, lay := range b.Layers {
			if len(lay) != l.LayerBytes() {
				t.Errorf("block %d: a layer of %d bytes, want %d", i, len(lay), l.LayerBytes())
			}
		}
	}
	// The partial block's rows 2 and 3 are zero, in K and in V; rows 0, 1 are not.
	row := 2 * 8 * 4
	for _, lay := range bs[2].Layers {
		k, v := lay[:4*row], lay[4*row:]
		if !allZero(k[2*row:]) || !allZero(v[2*row:]) || allZero(k[:row]) || allZero(v[:row]) {
			t.Error("a partial block's rows past its tokens are not zero, or its rows are")
		}
	}
}

func allZero(b []byte) bool { return !slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) }

func TestBadBatchesAreRefused(t *testing.T) {
	m := newModel(t, small())
	toks := prompt(10, 12)
	good := prefixAt(t, m, toks, 6) // 2 blocks, the second partial
	mut := func(f func(p []model.Block) []model.Block) []model.Block {
		p := slices.Clone(good)
		for i := range p {
			p[i].Layers = slices.Clone(p[i].Layers)
		}
		return f(p)
	}
	long := prompt(257, 13)
	for name, batch := range map[string][]model.Seq{
		"empty batch":            nil,
		"nothing to compute":     {{Tokens: toks, Cached: 10}},
		"cached but no prefix":   {{Tokens: toks, Cached: 6}},
		"one prefix block short": {{Tokens: toks, Cached: 6, Prefix: good[:1]}},
		"a prefix block too many": {{Tokens: toks, Cached: 6, Prefix: mut(func(p []model.Block) []model.Block {
			return append(p, p[1])
		})}},
		"prefix out of order":  {{Tokens: toks, Cached: 8, Prefix: mut(func(p []model.Block) []model.Block { p[0], p[1] = p[1], p[0]; return p })}},
		"a layer missing":      {{Tokens: toks, Cached: 6, Prefix: mut(func(p []model.Block) []model.Block { p[1].Layers = p[1].Layers[:1]; return p })}},
		"a layer short":        {{Tokens: toks, Cached: 6, Prefix: mut(func(p []model.Block) []model.Block { p[0].Layers[1] = p[0].Layers[1][:10]; return p })}},
		"a nil layer":          {{Tokens: toks, Cached: 6, Prefix: mut(func(p []model.Block) []model.Block { p[1].Layers[0] = nil; return p })}},
		"too few rows":         {{Tokens: toks, Cached: 7, Prefix: good}},
		"token past vocab":     {{Tokens: []uint32{1, 512}}},
		"over context length":  {{Tokens: long}},
		"negative temperature": {{Tokens: toks, Temperature: -1}},
		"NaN temperature":      {{Tokens: toks, Temperature: math.NaN()}},
		"second sequence bad":  {{Tokens: toks}, {Tokens: toks, Cached: 6, Prefix: good[:1]}},
	} {
		if _, err := m.Prefill(context.Background(), batch); !errors.Is(err, model.ErrBadBatch) {
			t.Errorf("%s: Prefill returned %v, want ErrBadBatch", name, err)
		}
	}
	if _, err := m.Decode(context.Background(), []model.Seq{{Tokens: toks, Cached: 6, Prefix: good}}); !errors.Is(err, model.ErrBadBatch) {
		t.Errorf("decode of 4 uncached tokens: %v, want ErrBadBatch", err)
	}
}

func TestCanceledStepReturnsTheContextsError(t *testing.T) {
	m := newModel(t, small())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Prefill(ctx, []model.Seq{{Tokens: prompt(5, 14)}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Prefill with a canceled context: %v", err)
	}
}

func TestConfig(t *testing.T) {
	var c Config
	c.EnsureDefaults()
	if c.Layers != 2 || c.Dim != 64 || c.Heads != 4 || c.KVHeads != 2 || c.HeadDim != 16 || c.Hidden != 192 ||
		c.Vocab != tokenizer.O200kVocab || c.BlockTokens != 16 || c.ContextLen != 4096 || c.Seed != 1 || c.Model != "tiny" {
		t.Errorf("defaults: %+v", c)
	}
	bad := Config{Layers: -1, Heads: 6, KVHeads: 4, HeadDim: 7, RopeTheta: -1}
	bad.EnsureDefaults()
	err := bad.Validate()
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Validate: %v", err)
	}
	for _, want := range []string{"layers is -1", "heads 6 is not a multiple of kv heads 4", "head dim is 7", "rope theta is -1"} {
		if !bytes.Contains([]byte(err.Error()), []byte(want)) {
			t.Errorf("Validate's error %q does not say %q", err, want)
		}
	}
	if _, err := New(Config{Dim: -3}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("New with a bad config: %v", err)
	}
}

func TestDefaultModelWithTheO200kVocabulary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the 51 MB embedding")
	}
	tok, err := tokenizer.O200k()
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(t, Config{})
	if m.Config().Vocab != tok.VocabSize() {
		t.Fatalf("vocab %d, the tokenizer's %d", m.Config().Vocab, tok.VocabSize())
	}
	if got, want := m.Layout().BlockBytes(), 2*2*2*16*4*16; got != want || m.Layout().Namespace.BlockBytes() != want {
		t.Errorf("block bytes %d (namespace %d), want %d", got, m.Layout().Namespace.BlockBytes(), want)
	}
	ids := tok.Encode("The cache exists for inference workers.")
	full, want := run(t, m, model.Seq{Tokens: ids})
	res, got := run(t, m, model.Seq{Tokens: ids, Cached: 5, Prefix: prefixAt(t, m, ids, 5)})
	if !sameBits(got[0], want[0]) || res.Next[0] != full.Next[0] {
		t.Error("restored prefix differs from a full recompute with the default config")
	}
	if int(full.Next[0]) >= tok.VocabSize() {
		t.Errorf("next token %d is past the vocabulary", full.Next[0])
	}
}

// Package sim is a model that costs time, not FLOPs: the model backend a
// worker runs where there is no GPU, and the one replays run in virtual
// time. It keeps the engine's real scheduler, pool, cache traffic and
// events; only the arithmetic is replaced.
//
// A step's time comes from a Profile: prefill time as a function of the
// batch's new tokens T, decode step time as a function of the active KV
// fraction p = the batch's KV tokens / the model's KV capacity (and, if the
// profile says so, of the batch size). The default profile is the
// polynomial NVIDIA Dynamo's mocker (its simulated vLLM-like engine)
// publishes as its default performance model:
//
//	prefill ms = 4.209989e-7·T² + 1.518344e-2·T + 16.50142
//	decode ms  = −25.74·p² + 54.01·p + 5.74, at least 1 ms
//
// Config.Speedup divides every modelled time, for replays. The model waits
// the time out through Config.Sleep, so a VirtualClock runs it in virtual
// time. A step's own work (making its blocks' KV bytes) counts towards its
// modelled time: it sleeps only the rest (Config.Now), so in real time a
// step takes its modelled time, not that plus the work.
//
// The KV bytes are real bytes that move through kvstrata, derived from the
// block's name (see Fill and Verify): each layer's slice has the size the
// layout says but no K/V structure; a partial block has none until it is
// full. The tokens it generates (Model.Next) are a function of the
// sequence's tokens: two runs, two workers, or a worker and a test agree
// on both.
//
// A Model is used by one engine loop at a time, as model.Model says.
package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/index"
)

// Config is a sim model's settings; the zero value is valid.
type Config struct {
	// Model names the model, the namespace's model. The default is "sim".
	Model string
	// Layers is the number of layers, each one slice of a block's KV. The
	// default is 4.
	Layers int
	// TokenBytes is the KV bytes of one token in one layer, a multiple of
	// 4: the layout is fp16, one KV head of head dim TokenBytes/4, K and V.
	// The default is 64, so that replays of long traces stay practical.
	TokenBytes int
	// BlockTokens is the block size in tokens. The default is 16.
	BlockTokens int
	// Capacity is the KV capacity in tokens that p is a fraction of: the
	// worker's GPU block pool. The default is 65536.
	Capacity int
	// Vocab is the number of token ids generated tokens are drawn from.
	// The default is 32000.
	Vocab int
	// Profile is the step times; nil means DefaultProfile.
	Profile *Profile
	// Speedup divides every modelled time (a replay at Speedup 10 runs ten
	// times faster than the modelled engine). The default is 1.
	Speedup float64
	// Sleep waits d or until ctx is done, returning ctx's error then. The
	// default sleeps in real time; VirtualClock.Sleep runs in virtual time.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now reads the clock Sleep waits on. A step does its work first
	// (making its blocks' KV bytes), measured on Now from the step's
	// start, and sleeps only the rest of its modelled time, so that it
	// takes its modelled time, not that plus the work; work that takes
	// longer than the modelled time is not slept at all. The default is
	// time.Now when Sleep is the default, else none: a step with a Sleep
	// of its own and no Now sleeps its whole modelled time, so that a
	// virtual clock's time never depends on the machine's speed.
	// VirtualClock.Now goes with VirtualClock.Sleep.
	Now func() time.Time
}

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("sim: bad config")

// EnsureDefaults fills c's zero fields with their documented defaults.
func (c *Config) EnsureDefaults() {
	if c.Model == "" {
		c.Model = "sim"
	}
	if c.Layers == 0 {
		c.Layers = 4
	}
	if c.TokenBytes == 0 {
		c.TokenBytes = 64
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
	if c.Capacity == 0 {
		c.Capacity = 65536
	}
	if c.Vocab == 0 {
		c.Vocab = 32000
	}
	if c.Profile == nil {
		p := DefaultProfile()
		c.Profile = &p
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Sleep == nil {
		c.Sleep = sleep
		if c.Now == nil {
			c.Now = time.Now
		}
	}
}

// Validate reports every problem of c, each naming its field, in one error
// wrapping ErrBadConfig, or nil.
func (c *Config) Validate() error {
	var probs []string
	if c.Layers < 0 {
		probs = append(probs, fmt.Sprintf("layers is %d, must be > 0", c.Layers))
	}
	if c.TokenBytes < 0 || c.TokenBytes%4 != 0 {
		probs = append(probs, fmt.Sprintf("token bytes is %d, must be a positive multiple of 4", c.TokenBytes))
	}
	if c.BlockTokens < 0 || c.BlockTokens > index.MaxBlockTokens {
		probs = append(probs, fmt.Sprintf("block tokens is %d, must be in [1, %d]", c.BlockTokens, index.MaxBlockTokens))
	}
	if c.Capacity < 0 {
		probs = append(probs, fmt.Sprintf("capacity is %d, must be > 0", c.Capacity))
	}
	if c.Vocab < 0 {
		probs = append(probs, fmt.Sprintf("vocab is %d, must be > 0", c.Vocab))
	}
	if !(c.Speedup > 0) || !finite(c.Speedup) {
		probs = append(probs, fmt.Sprintf("speedup is %v, must be > 0", c.Speedup))
	}
	if c.Profile != nil {
		if err := c.Profile.Validate(); err != nil {
			probs = append(probs, "profile: "+strings.TrimPrefix(err.Error(), ErrBadProfile.Error()+": "))
		}
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

// Model is the sim model.
type Model struct {
	cfg    Config
	layout model.Layout
	seed   uint64
}

var _ model.Model = (*Model)(nil)

// New returns a sim model with a copy of cfg, its zero fields defaulted.
func New(cfg Config) (*Model, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := *cfg.Profile // a copy the caller cannot change under the model
	for _, c := range []*Curve{&p.Prefill, &p.Decode} {
		c.Poly, c.Points = slices.Clone(c.Poly), slices.Clone(c.Points)
	}
	cfg.Profile = &p
	l := model.Layout{
		Namespace: index.Namespace{
			Model: cfg.Model,
			Layout: index.KVLayout{
				Layers: cfg.Layers, KVHeads: 1, HeadDim: cfg.TokenBytes / 4, DType: "fp16", TPSize: 1,
			},
			BlockTokens: cfg.BlockTokens,
		},
		DTypeBytes: 2,
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return &Model{cfg: cfg, layout: l, seed: l.Namespace.Seed()}, nil
}

// Layout is the model's KV layout: fp16, one KV head, head dim
// TokenBytes/4.
func (m *Model) Layout() model.Layout { return m.layout }

// Profile is the profile the model's times come from.
func (m *Model) Profile() Profile { return *m.cfg.Profile }

// PrefillTime is the modelled time, after the speedup, of a prefill step
// over newTokens uncached tokens of batch sequences.
func (m *Model) PrefillTime(newTokens, batch int) time.Duration {
	return m.scale(m.cfg.Profile.Prefill.At(float64(newTokens), batch))
}

// DecodeTime is the modelled time, after the speedup, of a decode step of
// batch sequences holding activeTokens KV tokens in all; p is
// activeTokens/Capacity, at most 1.
func (m *Model) DecodeTime(activeTokens, batch int) time.Duration {
	p := min(float64(activeTokens)/float64(m.cfg.Capacity), 1)
	return m.scale(m.cfg.Profile.Decode.At(p, batch))
}

func (m *Model) scale(d time.Duration) time.Duration {
	return time.Duration(float64(d) / m.cfg.Speedup)
}

// Prefill waits out the modelled time of the batch's uncached tokens, then
// returns their blocks and each sequence's next token.
func (m *Model) Prefill(ctx context.Context, batch []model.Seq) (model.Result, error) {
	start := m.now()
	if err := model.CheckBatch(batch, false); err != nil {
		return model.Result{}, err
	}
	var t int
	for _, s := range batch {
		t += len(s.Tokens) - s.Cached
	}
	return m.step(ctx, start, batch, m.PrefillTime(t, len(batch)))
}

// Decode waits out the modelled time of a decode step of the batch, then
// returns the blocks written and each sequence's next token.
func (m *Model) Decode(ctx context.Context, batch []model.Seq) (model.Result, error) {
	start := m.now()
	if err := model.CheckBatch(batch, true); err != nil {
		return model.Result{}, err
	}
	var active int
	for _, s := range batch {
		active += len(s.Tokens)
	}
	return m.step(ctx, start, batch, m.DecodeTime(active, len(batch)))
}

// step makes the batch's blocks and next tokens, then sleeps what is left
// of d since start (Config.Now): the step takes d in all, its work
// included, or its work's time when that is longer.
func (m *Model) step(ctx context.Context, start time.Time, batch []model.Seq, d time.Duration) (model.Result, error) {
	res := model.Result{Took: d, Next: make([]uint32, len(batch)), Blocks: make([][]model.Block, len(batch))}
	for i, s := range batch {
		res.Next[i], res.Blocks[i] = m.blocks(s)
	}
	if err := m.cfg.Sleep(ctx, sleepFor(d, m.now().Sub(start))); err != nil {
		return model.Result{}, fmt.Errorf("sim: step interrupted: %w", err)
	}
	return res, nil
}

// sleepFor is what a step of modelled time d sleeps after work that took
// spent: the rest of d, never less than 0.
func sleepFor(d, spent time.Duration) time.Duration {
	return max(d-max(spent, 0), 0)
}

// now is Config.Now's time, or the zero time when the model has no Now:
// then no work is measured.
func (m *Model) now() time.Time {
	if m.cfg.Now == nil {
		return time.Time{}
	}
	return m.cfg.Now()
}

// blocks returns the next token of s and the blocks from the one holding
// token s.Cached to the last.
func (m *Model) blocks(s model.Seq) (uint32, []model.Block) {
	bt := m.cfg.BlockTokens
	first := s.Cached / bt
	prev := m.seed
	if first > 0 && len(s.Prefix) >= first && s.Prefix[first-1].Hash != 0 && s.Prefix[first-1].Index == first-1 {
		prev = uint64(s.Prefix[first-1].Hash)
	} else if first > 0 {
		hs := index.AppendHashes(nil, m.seed, s.Tokens[:first*bt], bt)
		prev = uint64(hs[len(hs)-1])
	}
	var out []model.Block
	ns := m.layout.Namespace.ID()
	lb := m.layout.LayerBytes()
	for i := first; i*bt < len(s.Tokens); i++ {
		toks := s.Tokens[i*bt : min((i+1)*bt, len(s.Tokens))]
		b := model.Block{Index: i, Tokens: len(toks)}
		if len(toks) == bt {
			b.Hash = index.ChainHash(prev, toks)
			prev = uint64(b.Hash)
			buf := make([]byte, lb*m.cfg.Layers)
			b.Layers = make([][]byte, m.cfg.Layers)
			for l := range b.Layers {
				b.Layers[l] = buf[l*lb : (l+1)*lb : (l+1)*lb]
				Fill(b.Layers[l], ns, b.Hash, l)
			}
		}
		out = append(out, b)
	}
	return m.next(prev, s.Tokens[len(s.Tokens)/bt*bt:]), out
}

// next is the token the sim model generates after a sequence whose last
// full block hashed to prev (the namespace seed if it has none) and whose
// tokens after that block are tail: index.ChainHash(prev, tail) mod Vocab.
// It is a function of the sequence's tokens alone.
func (m *Model) next(prev uint64, tail []uint32) uint32 {
	return uint32(uint64(index.ChainHash(prev, tail)) % uint64(m.cfg.Vocab))
}

// Next is the token the model generates after tokens, computed without a
// step; tests and replays compare a worker's output with it.
func (m *Model) Next(tokens []uint32) uint32 {
	bt := m.cfg.BlockTokens
	prev := m.seed
	if hs := index.AppendHashes(nil, m.seed, tokens, bt); len(hs) > 0 {
		prev = uint64(hs[len(hs)-1])
	}
	return m.next(prev, tokens[len(tokens)/bt*bt:])
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/index"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newSim is a sim model on a virtual clock.
func newSim(t *testing.T, cfg Config) (*Model, *VirtualClock) {
	t.Helper()
	clk := NewVirtualClock(epoch)
	cfg.Sleep = clk.Sleep
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

func prompt(n int, salt uint32) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i)*2654435761 + salt
	}
	return toks
}

func TestPrefillOfCachedPrefixCostsOnlyNewTokens(t *testing.T) {
	m, clk := newSim(t, Config{})
	ctx := context.Background()
	toks := prompt(1000, 1)

	full, err := m.Prefill(ctx, []model.Seq{{Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	hit, err := m.Prefill(ctx, []model.Seq{{Tokens: toks, Cached: 960}})
	if err != nil {
		t.Fatal(err)
	}
	if want := ms(4.209989e-7*40*40 + 1.518344e-2*40 + 16.50142); !near(hit.Took, want) {
		t.Errorf("prefill of 40 new tokens behind 960 cached: %v, want the profile's %v for 40", hit.Took, want)
	}
	if want := ms(4.209989e-7*1000*1000 + 1.518344e-2*1000 + 16.50142); !near(full.Took, want) {
		t.Errorf("prefill of 1000 tokens: %v, want %v", full.Took, want)
	}
	if got := clk.Now().Sub(epoch); got != full.Took+hit.Took {
		t.Errorf("the clock advanced %v, want the two steps' %v", got, full.Took+hit.Took)
	}
	// The same sequence's next token, and the blocks from the one holding token 960 on.
	if full.Next[0] != hit.Next[0] || full.Next[0] != m.Next(toks) {
		t.Errorf("next token %d with no cache, %d with a hit, %d by Next", full.Next[0], hit.Next[0], m.Next(toks))
	}
	if got := len(full.Blocks[0]); got != 63 {
		t.Fatalf("1000 tokens in blocks of 16 gave %d blocks, want 63 (62 full, 1 partial)", got)
	}
	if !blocksEqual(hit.Blocks[0], full.Blocks[0][60:]) {
		t.Error("a prefill behind a cached prefix wrote other blocks than a full prefill")
	}
}

func blocksEqual(a, b []model.Block) bool {
	return slices.EqualFunc(a, b, func(x, y model.Block) bool {
		return x.Index == y.Index && x.Tokens == y.Tokens && x.Hash == y.Hash &&
			slices.EqualFunc(x.Layers, y.Layers, func(p, q []byte) bool { return string(p) == string(q) })
	})
}

func TestPrefillBlocksAreNamedAndVerifiable(t *testing.T) {
	m, _ := newSim(t, Config{Layers: 3, TokenBytes: 32, BlockTokens: 8})
	l := m.Layout()
	if got := l.TokenLayerBytes(); got != 32 {
		t.Fatalf("token layer bytes %d, configured 32", got)
	}
	toks := prompt(30, 2)
	res, err := m.Prefill(context.Background(), []model.Seq{{Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	hashes := l.Namespace.Hashes(toks)
	blocks := res.Blocks[0]
	if len(blocks) != 4 || len(hashes) != 3 {
		t.Fatalf("%d blocks and %d hashes for 30 tokens in blocks of 8, want 4 and 3", len(blocks), len(hashes))
	}
	ns := l.Namespace.ID()
	for i, b := range blocks[:3] {
		if b.Index != i || !b.Full(l) || b.Hash != hashes[i] || len(b.Layers) != 3 {
			t.Fatalf("block %d: index %d, %d tokens, hash %v (want %v), %d layers", i, b.Index, b.Tokens, b.Hash, hashes[i], len(b.Layers))
		}
		for layer, kv := range b.Layers {
			if len(kv) != l.LayerBytes() || !Verify(ns, b.Hash, layer, kv) {
				t.Errorf("block %d layer %d: %d bytes that verify %v", i, layer, len(kv), Verify(ns, b.Hash, layer, kv))
			}
		}
	}
	if p := blocks[3]; p.Full(l) || p.Tokens != 6 || p.Hash != 0 || p.Layers != nil {
		t.Errorf("the partial block: %+v, want 6 tokens, no hash, no bytes", p)
	}
}

// TestGenerationIsDeterministic: a sequence decoded step by step gives the
// tokens and blocks that one prefill of the whole sequence gives, in any
// model with the same configuration.
func TestGenerationIsDeterministic(t *testing.T) {
	ctx := context.Background()
	a, _ := newSim(t, Config{BlockTokens: 4})
	b, _ := newSim(t, Config{BlockTokens: 4})
	toks := prompt(10, 3)
	res, err := a.Prefill(ctx, []model.Seq{{Tokens: toks}})
	if err != nil {
		t.Fatal(err)
	}
	seq := append(slices.Clone(toks), res.Next[0])
	// The prompt's full blocks, as the pool would hand them back: sim
	// continues the hash chain from the last one.
	written := res.Blocks[0][:10/4]
	for range 7 {
		res, err := a.Decode(ctx, []model.Seq{{Tokens: seq, Cached: len(seq) - 1, Prefix: written}})
		if err != nil {
			t.Fatal(err)
		}
		blk := res.Blocks[0]
		if len(blk) != 1 || blk[0].Index != (len(seq)-1)/4 {
			t.Fatalf("decode wrote %+v, want the one block holding token %d", blk, len(seq)-1)
		}
		if blk[0].Full(a.Layout()) {
			written = append(written, blk[0])
		}
		seq = append(seq, res.Next[0])
	}
	whole, err := b.Prefill(ctx, []model.Seq{{Tokens: seq[:len(seq)-1]}})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Next[0] != seq[len(seq)-1] {
		t.Errorf("prefill of the decoded sequence predicts %d, decode gave %d", whole.Next[0], seq[len(seq)-1])
	}
	var full []model.Block
	for _, blk := range whole.Blocks[0] {
		if blk.Full(b.Layout()) && blk.Index >= 10/4 {
			full = append(full, blk)
		}
	}
	if !blocksEqual(written[10/4:], full) {
		t.Errorf("decode filled blocks %v, prefill of the same tokens %v", written, full)
	}
	other := append(slices.Clone(toks[:9]), toks[9]+1)
	if a.Next(other) == a.Next(toks) && a.Next(other[:9]) == a.Next(toks[:8]) {
		t.Error("different sequences predict the same tokens")
	}
}

func TestDecodeTimeFollowsActiveFraction(t *testing.T) {
	m, _ := newSim(t, Config{Capacity: 1000})
	seqs := []model.Seq{{Tokens: prompt(250, 4), Cached: 249}, {Tokens: prompt(250, 5), Cached: 249}}
	res, err := m.Decode(context.Background(), seqs)
	if err != nil {
		t.Fatal(err)
	}
	// p = 500 / 1000
	if want := ms(-25.74*0.25 + 54.01*0.5 + 5.74); !near(res.Took, want) {
		t.Errorf("decode at p=0.5: %v, want %v", res.Took, want)
	}
	if len(res.Next) != 2 || res.Next[0] != m.Next(seqs[0].Tokens) || res.Next[1] != m.Next(seqs[1].Tokens) {
		t.Errorf("next tokens %v", res.Next)
	}
}

func TestSpeedupDividesTime(t *testing.T) {
	ctx := context.Background()
	slow, slowClk := newSim(t, Config{Capacity: 1000})
	fast, fastClk := newSim(t, Config{Capacity: 1000, Speedup: 10})
	pre := []model.Seq{{Tokens: prompt(2048, 6)}}
	dec := []model.Seq{{Tokens: prompt(400, 7), Cached: 399}}
	for _, m := range []*Model{slow, fast} {
		if _, err := m.Prefill(ctx, pre); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Decode(ctx, dec); err != nil {
			t.Fatal(err)
		}
	}
	s, f := slowClk.Now().Sub(epoch), fastClk.Now().Sub(epoch)
	if !near(f*10, s) {
		t.Errorf("at speedup 10 the steps took %v, at 1 %v: not a tenth", f, s)
	}
	if got, want := fast.DecodeTime(400, 1), slow.DecodeTime(400, 1)/10; !near(got, want) {
		t.Errorf("decode time at speedup 10: %v, want %v", got, want)
	}
}

func TestStepStopsWithItsContext(t *testing.T) {
	m, clk := newSim(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Prefill(ctx, []model.Seq{{Tokens: prompt(10, 8)}}); !errors.Is(err, context.Canceled) {
		t.Errorf("prefill with a cancelled context: %v", err)
	}
	if clk.Now() != epoch {
		t.Error("a cancelled step advanced the clock")
	}
	// The real sleeper, too, returns when the context is done.
	real, err := New(Config{Speedup: 1e-6}) // a 16 ms step takes hours
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := real.Prefill(ctx, []model.Seq{{Tokens: prompt(10, 8)}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("prefill past its deadline: %v", err)
	}
}

func TestBadBatchChangesNothing(t *testing.T) {
	m, clk := newSim(t, Config{})
	ctx := context.Background()
	if _, err := m.Prefill(ctx, []model.Seq{{Tokens: prompt(4, 9), Cached: 4}}); !errors.Is(err, model.ErrBadBatch) {
		t.Errorf("prefill with nothing to compute: %v", err)
	}
	if _, err := m.Decode(ctx, []model.Seq{{Tokens: prompt(4, 9), Cached: 2}}); !errors.Is(err, model.ErrBadBatch) {
		t.Errorf("decode of two tokens: %v", err)
	}
	if clk.Now() != epoch {
		t.Error("a refused batch advanced the clock")
	}
}

func TestBadConfigNamesField(t *testing.T) {
	bad := DefaultProfile()
	bad.Decode.MinMs = -1
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{TokenBytes: 6}, "token bytes is 6"},
		{Config{Speedup: -2}, "speedup is -2"},
		{Config{Layers: -1}, "layers is -1"},
		{Config{BlockTokens: index.MaxBlockTokens + 1}, "block tokens"},
		{Config{Capacity: -5}, "capacity is -5"},
		{Config{Profile: &bad}, "profile: decode.min_ms is -1"},
	} {
		_, err := New(tc.cfg)
		if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want ErrBadConfig saying %q", tc.cfg, err, tc.want)
		}
	}
}

func TestDefaultLayout(t *testing.T) {
	m, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := m.Layout()
	if l.TokenLayerBytes() != 64 || l.Namespace.BlockTokens != 16 || l.Namespace.Layout.Layers != 4 {
		t.Errorf("default layout %+v: want 64 B per token and layer, blocks of 16, 4 layers", l)
	}
	if l.BlockBytes() != l.Namespace.BlockBytes() {
		t.Errorf("block bytes %d, the namespace says %d", l.BlockBytes(), l.Namespace.BlockBytes())
	}
}

// BenchmarkDecode64 is the sim model's own cost of a decode step of 64
// sequences of 1024 tokens, in virtual time: what it adds to the modelled
// step.
func BenchmarkDecode64(b *testing.B) {
	clk := NewVirtualClock(epoch)
	m, err := New(Config{Sleep: clk.Sleep})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]model.Seq, 64)
	for i := range batch {
		toks := prompt(1024, uint32(i))
		res, err := m.Prefill(context.Background(), []model.Seq{{Tokens: toks[:1023]}})
		if err != nil {
			b.Fatal(err)
		}
		batch[i] = model.Seq{Tokens: toks, Cached: 1023, Prefix: res.Blocks[0]}
	}
	b.ResetTimer()
	for range b.N {
		if _, err := m.Decode(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}

// stepClock is a Now and a Sleep for a step's arithmetic: Now reads start
// at the step's start and start + work after its work; Sleep records what
// it is asked to sleep.
type stepClock struct {
	start time.Time
	work  time.Duration
	reads int
	slept []time.Duration
}

func (c *stepClock) Now() time.Time {
	c.reads++
	if c.reads%2 == 1 {
		return c.start
	}
	return c.start.Add(c.work)
}

func (c *stepClock) Sleep(_ context.Context, d time.Duration) error {
	c.slept = append(c.slept, d)
	return nil
}

// A step's work (making its blocks' KV bytes) is part of its modelled
// time: it sleeps the rest, never a negative time.
func TestAStepSleepsWhatItsWorkLeftOfItsModelledTime(t *testing.T) {
	for _, work := range []time.Duration{0, 10 * time.Millisecond, time.Hour} {
		clk := &stepClock{start: epoch, work: work}
		m, err := New(Config{Sleep: clk.Sleep, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		pre := []model.Seq{{Tokens: prompt(2048, 11)}}
		res, err := m.Prefill(context.Background(), pre)
		if err != nil {
			t.Fatal(err)
		}
		dec := []model.Seq{{Tokens: prompt(2049, 11), Cached: 2048, Prefix: res.Blocks[0]}}
		if _, err := m.Decode(context.Background(), dec); err != nil {
			t.Fatal(err)
		}
		want := []time.Duration{max(m.PrefillTime(2048, 1)-work, 0), max(m.DecodeTime(2049, 1)-work, 0)}
		if !slices.Equal(clk.slept, want) || clk.reads != 4 {
			t.Errorf("work of %v: the steps slept %v (Now read %d times), want %v: their modelled %v and %v less the work",
				work, clk.slept, clk.reads, want, m.PrefillTime(2048, 1), m.DecodeTime(2049, 1))
		}
		if res.Took != m.PrefillTime(2048, 1) {
			t.Errorf("work of %v: the prefill says it took %v, want its modelled %v", work, res.Took, m.PrefillTime(2048, 1))
		}
	}
	// A Sleep of its own without a Now sleeps the whole modelled time.
	clk := &stepClock{start: epoch, work: time.Second}
	m, err := New(Config{Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Prefill(context.Background(), []model.Seq{{Tokens: prompt(100, 12)}}); err != nil {
		t.Fatal(err)
	}
	if want := m.PrefillTime(100, 1); len(clk.slept) != 1 || clk.slept[0] != want || clk.reads != 0 {
		t.Errorf("without a Now: slept %v (Now read %d times), want [%v]", clk.slept, clk.reads, want)
	}
}

// In real time, a step with many KV bytes to make takes its modelled time:
// not less (the work is taken off the sleep, never more than the sleep),
// and not its modelled time plus a lot more. The upper bound is loose, for
// a loaded machine; TestAStepSleepsWhatItsWorkLeftOfItsModelledTime
// checks the arithmetic.
func TestARealStepWithManyKVBytesTakesItsModelledTime(t *testing.T) {
	m, err := New(Config{Layers: 8, TokenBytes: 64, Speedup: 0.25}) // 8 KiB a block, 1 MiB for the prompt
	if err != nil {
		t.Fatal(err)
	}
	const n = 2048
	want := m.PrefillTime(n, 1) // about 200 ms
	start := time.Now()
	if _, err := m.Prefill(context.Background(), []model.Seq{{Tokens: prompt(n, 13)}}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("a modelled %v prefill of %d tokens, 1 MiB of KV, took %v", want, n, took)
	if took < want {
		t.Errorf("the step took %v, less than its modelled %v", took, want)
	}
	if slack := 2 * time.Second; took > want+slack {
		t.Errorf("the step took %v, more than its modelled %v + %v", took, want, slack)
	}
}

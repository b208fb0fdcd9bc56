package sched

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
)

// warm runs p through a first worker whose full blocks land in conn, as
// offloads do, and returns conn.
func warm(t *testing.T, p []uint32, maxTokens int) *mapConn {
	t.Helper()
	conn := newMapConn()
	m := newSim(t)
	e := newEngine(t, Config{Model: m, Connector: conn})
	generate(t, e, Request{Prompt: p, MaxTokens: maxTokens})
	e.Close()
	return conn
}

func TestOnboardingFromTheCache(t *testing.T) {
	p := prompt(100, 1) // 6 full blocks and 4 tokens: 96 tokens may come from the cache
	for _, tc := range []struct {
		name  string
		fault func(c *mapConn)
		// onboarded and recomputed tokens, cache errors
		onboarded, recomputed, errs int
	}{
		{"all", func(*mapConn) {}, 96, 0, 0},
		{"partial load", func(c *mapConn) { c.loadOnly = 2 }, 32, 64, 0},
		{"load fails midway", func(c *mapConn) { c.loadOnly, c.loadErr = 1, errInjected }, 16, 80, 1},
		{"lookup fails", func(c *mapConn) { c.lookupErr = errInjected }, 0, 0, 1},
		{"cache too slow", func(c *mapConn) { c.hang = true }, 0, 0, 1},
		{"cache empty", func(c *mapConn) { clear(c.blocks) }, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := warm(t, p, 1)
			conn.set(tc.fault)
			m := newSim(t)
			rec := &recorder{Model: m}
			e := newEngine(t, Config{Model: rec, Connector: conn, CacheTimeout: 50 * time.Millisecond})
			toks, last := generate(t, e, Request{Prompt: p, MaxTokens: 10})
			if !slices.Equal(toks, want(m, p, 10)) || last.Err != nil {
				t.Fatalf("tokens %v (err %v), want the model's %v", toks, last.Err, want(m, p, 10))
			}
			if u := last.Usage; u.OnboardedTokens != tc.onboarded || u.CachedTokens != tc.onboarded {
				t.Errorf("usage %+v, want %d tokens onboarded and cached", u, tc.onboarded)
			}
			if c := rec.calls[0]; c.decode || c.seqs[0].Cached != tc.onboarded {
				t.Errorf("the prefill starts at token %d, want %d", c.seqs[0].Cached, tc.onboarded)
			}
			rec.checkKV(t)
			st := e.Stats()
			if st.OnboardedTokens != uint64(tc.onboarded) || st.RecomputedTokens != uint64(tc.recomputed) || st.CacheErrors != uint64(tc.errs) {
				t.Errorf("counted %d onboarded, %d recomputed tokens, %d cache errors; want %d, %d, %d",
					st.OnboardedTokens, st.RecomputedTokens, st.CacheErrors, tc.onboarded, tc.recomputed, tc.errs)
			}
			// The onboarded blocks are in the pool now: a second request finds them there.
			if tc.onboarded > 0 {
				if _, last := generate(t, e, Request{Prompt: p, MaxTokens: 1}); last.Usage.CachedTokens != 96 || last.Usage.OnboardedTokens != 0 {
					t.Errorf("a second request: usage %+v, want the 96 tokens from the pool", last.Usage)
				}
			}
		})
	}
}

func TestOnboardingDoesNotHoldUpOtherRequests(t *testing.T) {
	p := prompt(100, 1)
	conn := warm(t, p, 1)
	conn.set(func(c *mapConn) { c.hang = true })
	m := newSim(t)
	e := newEngine(t, Config{Model: m, Connector: conn, CacheTimeout: time.Hour})
	slow, err := e.Generate(context.Background(), Request{Prompt: p, MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	<-conn.hanging // the slow request's Lookup has started, and hangs
	// A prompt shorter than a block has nothing to onboard: it runs at once.
	short := prompt(10, 2)
	if toks, _ := generate(t, e, Request{Prompt: short, MaxTokens: 20}); !slices.Equal(toks, want(m, short, 20)) {
		t.Errorf("the other request got the wrong tokens")
	}
	if st := e.Stats(); st.Onboarding != 1 {
		t.Errorf("%d requests onboarding while the cache hangs, want 1", st.Onboarding)
	}
	select {
	case o := <-slow:
		t.Fatalf("the onboarding request produced %+v before its cache answered", o)
	default:
	}
	conn.set(func(c *mapConn) { c.hang = false })
	close(conn.unhang)
	toks, last := collect(t, slow)
	if !slices.Equal(toks, want(m, p, 5)) || last.Usage.OnboardedTokens != 96 {
		t.Errorf("the onboarded request: tokens %v usage %+v, want the model's and 96 onboarded", toks, last.Usage)
	}
}

func TestCancelledWhileOnboarding(t *testing.T) {
	p := prompt(100, 1)
	conn := warm(t, p, 1)
	conn.set(func(c *mapConn) { c.hang = true })
	e := newEngine(t, Config{Model: newSim(t), Connector: conn, CacheTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, Request{Prompt: p, MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	<-conn.hanging
	cancel()
	if _, last := collect(t, ch); last.Finish != FinishAbort {
		t.Errorf("finish %q, want abort", last.Finish)
	}
	if st := e.Stats(); st.Pool.Free != st.Pool.Blocks || st.CacheErrors != 0 {
		t.Errorf("after cancelling an onboarding: %d of %d blocks free, %d cache errors; want all free, none",
			st.Pool.Free, st.Pool.Blocks, st.CacheErrors)
	}
}

func TestOffloadedBlocksCarryTheirBytesAndParents(t *testing.T) {
	conn := newMapConn()
	m := newSim(t)
	e := newEngine(t, Config{Model: m, Connector: conn})
	p := prompt(100, 4)
	toks, _ := generate(t, e, Request{Prompt: p, MaxTokens: 40})
	// 139 tokens have their KV (the last generated one is never computed):
	// 8 full blocks, prompt's and generated ones.
	all := append(slices.Clone(p), toks...)
	ns := m.Layout().Namespace
	hs := ns.Hashes(all[:139])

	check := func(t *testing.T, offloads [][]Block, want []index.Hash) {
		t.Helper()
		var got []index.Hash
		for _, batch := range offloads {
			for _, b := range batch {
				got = append(got, b.Hash)
				i := slices.Index(hs, b.Hash)
				if i < 0 {
					t.Errorf("offloaded block %v is not one of the sequence's", b.Hash)
					continue
				}
				if i > 0 && (!b.HasParent || b.Parent != hs[i-1]) || i == 0 && b.HasParent {
					t.Errorf("block %d: parent %v (%v), want %v", i, b.Parent, b.HasParent, hs[max(i-1, 0)])
				}
				if !sim.VerifyBlock(ns.ID(), b.Hash, ns.Layout.Layers, b.Data) || len(b.Data) != m.Layout().BlockBytes() {
					t.Errorf("block %d: its %d bytes are not the block's KV", i, len(b.Data))
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("offloaded %v, want %v, each once, in order", got, want)
		}
	}
	check(t, conn.offloads, hs)

	// The same prompt again: its blocks come from the pool and are not
	// offloaded again; only what it computes anew is.
	conn.set(func(c *mapConn) { c.offloads = nil })
	generate(t, e, Request{Prompt: p, MaxTokens: 40})
	check(t, conn.offloads, nil)
}

func TestWithoutAConnectorNothingIsOffloaded(t *testing.T) {
	m := newSim(t)
	e := newEngine(t, Config{Model: m})
	p := prompt(100, 4)
	if toks, _ := generate(t, e, Request{Prompt: p, MaxTokens: 40}); !slices.Equal(toks, want(m, p, 40)) {
		t.Errorf("wrong tokens without a cache")
	}
	if st := e.Stats(); st.OffloadedBlocks != 0 || st.OnboardedTokens != 0 {
		t.Errorf("stats %+v without a connector", st.counters)
	}
}

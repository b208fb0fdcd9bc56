package sched_test

// The engine loop and its cache connector together, against a real cache
// node served in-process (api/nodetest: gRPC and the TCP data plane on
// loopback): what the engine onboards from kvstrata decodes as a full
// recompute does, whatever the cache does, and what it offloads is there.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/engine/kvconn"
	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
)

// startNode serves a cache node large enough that nothing a test stores
// is evicted.
func startNode(t testing.TB) *nodetest.Node {
	t.Helper()
	return nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20, SSDBytes: 16 << 20})
}

// newConn connects to the cache node at addr, closed when the test ends
// (after the engines made later: cleanups run last first).
func newConn(t testing.TB, addr string, reg prometheus.Registerer) *kvconn.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := kvconn.New(ctx, kvconn.Config{Addr: addr, Registerer: reg, ModelName: "m", Logger: slog.New(slog.DiscardHandler),
		Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, CloseTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newEngine starts an engine, closed when the test ends. Its CacheTimeout
// is 30 s unless cfg says: a cache that answers is never timed out, however
// loaded the machine, and the tests of a cache that does not set their own.
func newEngine(t testing.TB, cfg sched.Config) *sched.Engine {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	if cfg.CacheTimeout == 0 {
		cfg.CacheTimeout = 30 * time.Second
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "m"
	}
	e, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// dial is a plain client of the node, to look at what it holds.
func dial(t testing.TB, addr string) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tinyModel is a small tiny transformer: the whole structure (grouped-query
// attention, two layers) at a size -race runs quickly; blocks of 4 tokens.
func tinyModel(t testing.TB) *tiny.Model {
	t.Helper()
	m, err := tiny.New(tiny.Config{Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, Hidden: 64, Vocab: 512,
		BlockTokens: 4, ContextLen: 256, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// simModel is a sim model whose steps sleep their modelled time divided by
// speedup; 0 runs it on a virtual clock (no wall time at all).
func simModel(t testing.TB, speedup float64) *sim.Model {
	t.Helper()
	cfg := sim.Config{Speedup: speedup}
	if speedup == 0 {
		cfg.Speedup = 1
		cfg.Sleep = sim.NewVirtualClock(time.Unix(0, 0)).Sleep
	}
	m, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tokens is n token ids below 512 (tiny's test vocabulary), different for
// each salt.
func tokens(n int, salt uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = (uint32(i)*2654435761 + salt*7919) >> 7 % 512
	}
	return out
}

// run generates req to its end and returns its tokens and last Output.
func run(t testing.TB, e *sched.Engine, req sched.Request) ([]uint32, sched.Output) {
	t.Helper()
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var toks []uint32
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case o, ok := <-ch:
			if !ok {
				t.Fatal("the channel closed without a last Output")
			}
			toks = append(toks, o.Tokens...)
			if o.Finish != "" {
				return toks, o
			}
		case <-deadline:
			t.Fatal("no last Output within two minutes")
		}
	}
}

// eventually polls cond until it holds, failing after a minute: long
// enough for what these tests wait for on a loaded machine.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still not true after a minute: %s", what)
		}
	}
}

// held is how many leading blocks of hashes the node holds.
func held(t testing.TB, cl *client.Client, ns index.NamespaceID, hashes []index.Hash) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Lookup(ctx, ns, hashes)
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.GetBlocks())
}

// waitHeld waits until the node holds every full block of toks.
func waitHeld(t testing.TB, cl *client.Client, l model.Layout, toks []uint32) []index.Hash {
	t.Helper()
	hs := l.Namespace.Hashes(toks)
	eventually(t, fmt.Sprintf("the node holds the %d full blocks", len(hs)), func() bool {
		return held(t, cl, l.Namespace.ID(), hs) == len(hs)
	})
	return hs
}

// counter is the value of the counter name gathered from reg whose labels
// include the name=value pairs of want; -1 if there is none.
func counter(t testing.TB, reg *prometheus.Registry, name string, want ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(want); i += 2 {
				if have[want[i]] != want[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// A worker registers its engine's metrics and its connector's on one
// registry: their names must not collide.
func TestEngineAndConnectorShareARegistry(t *testing.T) {
	n := startNode(t)
	reg := prometheus.NewRegistry()
	conn := newConn(t, n.Addr, reg)
	e := newEngine(t, sched.Config{Model: simModel(t, 0), Connector: conn, Registerer: reg})
	run(t, e, sched.Request{Prompt: tokens(40, 1), MaxTokens: 2})
	if v := counter(t, reg, "kvstrata_engine_cache_errors_total", "op", "lookup"); v != 0 {
		t.Errorf("the connector's lookup errors: %v, want 0", v)
	}
	if v := counter(t, reg, "kvstrata_engine_cache_failures_total"); v != 0 {
		t.Errorf("the engine's cache failures: %v, want 0", v)
	}
}

// recompute is what a worker without a cache generates for req: the
// reference every onboarding must match.
func recompute(t testing.TB, m model.Model, req sched.Request) []uint32 {
	t.Helper()
	e := newEngine(t, sched.Config{Model: m})
	toks, last := run(t, e, req)
	if last.Err != nil || last.Usage.CachedTokens != 0 {
		t.Fatalf("the recompute: %v, usage %+v", last.Err, last.Usage)
	}
	e.Close()
	return toks
}

var samplings = []struct {
	name string
	s    sched.Sampling
}{{"greedy", sched.Sampling{}}, {"seeded temperature", sched.Sampling{Temperature: 0.9, Seed: 42}}}

// A prompt whose prefix is onboarded from kvstrata — by another engine,
// and by the same engine once its pool has forgotten it — generates what a
// full recompute does, token for token, with the tiny transformer (whose
// attention reads every restored byte).
func TestTinyOnboardedPrefixGeneratesAsARecompute(t *testing.T) {
	for _, sm := range samplings {
		t.Run(sm.name, func(t *testing.T) {
			m := tinyModel(t)
			l := m.Layout()
			p := tokens(37, 3) // 9 full blocks of 4 and one token
			req := sched.Request{Prompt: p, MaxTokens: 12, Sampling: sm.s, IgnoreEOS: true}
			want := recompute(t, m, req)
			const onboard = 36 // the 9 full blocks: the last token's block is always computed

			n := startNode(t)
			cl := dial(t, n.Addr)
			first := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil), Blocks: 24})
			toks, last := run(t, first, req)
			if !slices.Equal(toks, want) || last.Usage.CachedTokens != 0 {
				t.Fatalf("first run: %v (usage %+v), want the recompute's %v", toks, last.Usage, want)
			}
			// The KV of the prompt and of all generated tokens but the last.
			waitHeld(t, cl, l, append(slices.Clone(p), toks[:len(toks)-1]...))

			check := func(t *testing.T, e *sched.Engine, who string) {
				t.Helper()
				before := e.Stats()
				toks, last := run(t, e, req)
				if !slices.Equal(toks, want) {
					t.Errorf("%s: %v, want the recompute's %v", who, toks, want)
				}
				if u := last.Usage; last.Err != nil || u.OnboardedTokens != onboard || u.CachedTokens != onboard {
					t.Errorf("%s: err %v, usage %+v; want %d tokens onboarded", who, last.Err, u, onboard)
				}
				st := e.Stats()
				if st.OnboardedTokens-before.OnboardedTokens != onboard || st.RecomputedTokens != before.RecomputedTokens ||
					st.CacheErrors != before.CacheErrors {
					t.Errorf("%s: %d tokens onboarded, %d recomputed, %d cache errors; want %d, 0, 0", who,
						st.OnboardedTokens-before.OnboardedTokens, st.RecomputedTokens-before.RecomputedTokens,
						st.CacheErrors-before.CacheErrors, onboard)
				}
			}
			check(t, newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)}), "another engine")

			// A prompt that takes the whole pool of 24 blocks evicts every
			// block the first request left cached there.
			if _, last := run(t, first, sched.Request{Prompt: tokens(86, 4), MaxTokens: 10}); last.Err != nil {
				t.Fatal(last.Err)
			}
			check(t, first, "the same engine, its pool emptied")
		})
	}
}

// evictAfterLookup is a Connector that evicts a block from the node right
// after the engine's Lookup answered, before its Load: the node's answer
// goes stale in between, as it may under eviction pressure.
type evictAfterLookup struct {
	sched.Connector
	evict func()
}

func (c evictAfterLookup) Lookup(ctx context.Context, ns index.NamespaceID, hs []index.Hash) (int, error) {
	n, err := c.Connector.Lookup(ctx, ns, hs)
	c.evict()
	return n, err
}

// A block missing in the middle of the prompt's chain, a corrupt one, and
// a cache that is down or slower than CacheTimeout each make the engine
// compute what the cache did not deliver: the tokens are the recompute's,
// the request succeeds, and the counters say what happened.
func TestTinyCacheFaultsAreRecomputed(t *testing.T) {
	m := tinyModel(t)
	l := m.Layout()
	ns := l.Namespace.ID()
	p := tokens(37, 5)
	req := sched.Request{Prompt: p, MaxTokens: 8, IgnoreEOS: true, Sampling: sched.Sampling{Temperature: 0.7, Seed: 7}}
	want := recompute(t, m, req)

	// warm serves a node holding the prompt's 9 full blocks, offloaded by
	// an engine, and returns it with their hashes.
	warm := func(t *testing.T) (*nodetest.Node, []index.Hash) {
		n := startNode(t)
		e := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)})
		run(t, e, sched.Request{Prompt: p, MaxTokens: 1})
		return n, waitHeld(t, dial(t, n.Addr), l, p)
	}
	// evict removes block h from the node (Errorf: it may run on the
	// engine's onboarding goroutine).
	evict := func(t *testing.T, n *nodetest.Node, h index.Hash) {
		if r, err := n.Evict(node.Selector{Keys: []index.Key{{NS: ns, Hash: h}}}); err != nil || r.Blocks == 0 {
			t.Errorf("evicting block %v: %+v, %v", h, r, err)
		}
	}

	for _, tc := range []struct {
		name string
		// conn returns the engine's Connector, after breaking the cache.
		conn func(t *testing.T, reg prometheus.Registerer) sched.Connector
		// onboarded (-1: some, not all) and recomputed tokens, cache
		// errors (the engine's); the connector's errors by op.
		onboarded, recomputed, errs int
		connErrs                    map[string]float64
		// timeout is the engine's CacheTimeout, for a cache that hangs.
		timeout time.Duration
	}{
		{name: "a block evicted", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			n, hs := warm(t)
			evict(t, n, hs[4])
			return newConn(t, n.Addr, reg)
		}, onboarded: 16}, // the lookup says 4 blocks: the rest is a miss, computed
		{name: "a block evicted between lookup and load", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			n, hs := warm(t)
			return evictAfterLookup{newConn(t, n.Addr, reg), func() { evict(t, n, hs[4]) }}
		}, onboarded: 16, recomputed: 20},
		{name: "a block corrupt", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			n, hs := warm(t)
			// DRAM serves its arena's bytes with the block's checksum: a
			// flipped byte is found out by the client on arrival.
			v, _, err := n.View(index.Key{NS: ns, Hash: hs[4]})
			if err != nil {
				t.Fatal(err)
			}
			v.Bytes()[100] ^= 0x40
			if err := v.Release(); err != nil {
				t.Fatal(err)
			}
			return newConn(t, n.Addr, reg)
		}, onboarded: 16, recomputed: 20, errs: 1, connErrs: map[string]float64{"load": 1}},
		{name: "the cache down", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			n, _ := warm(t)
			px := startProxy(t, n.Addr)
			c := newConn(t, px.Addr(), reg)
			px.Down()
			return c
		}, errs: 1, connErrs: map[string]float64{"lookup": 1}},
		{name: "the cache slower than CacheTimeout", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			n, _ := warm(t)
			px := startProxy(t, n.Addr)
			c := newConn(t, px.Addr(), reg)
			px.Stall()
			return c
		}, errs: 1, connErrs: map[string]float64{"lookup": 1}, timeout: 300 * time.Millisecond},
		{name: "the data plane stalled in the middle of the load", conn: func(t *testing.T, reg prometheus.Registerer) sched.Connector {
			// The node's Info names a proxy in front of its data plane,
			// which lets a response's first 4 KiB through (about 3 of the
			// 9 blocks of 1 KiB, the last of them perhaps in part) and
			// then holds the rest past CacheTimeout.
			px := startProxy(t, "")
			n := nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20, DataAddr: px.Addr()})
			px.SetTarget(n.DataAddr)
			e := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)})
			run(t, e, sched.Request{Prompt: p, MaxTokens: 1})
			waitHeld(t, dial(t, n.Addr), l, p)
			px.StallAfter(4 << 10)
			return newConn(t, n.Addr, reg)
		}, onboarded: -1, errs: 1, connErrs: map[string]float64{"load": 1}, timeout: 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			conn := tc.conn(t, reg)
			e := newEngine(t, sched.Config{Model: m, Connector: conn, Registerer: reg, CacheTimeout: tc.timeout})
			toks, last := run(t, e, req)
			if !slices.Equal(toks, want) || last.Err != nil || last.Finish != sched.FinishLength {
				t.Fatalf("%v (finish %q, err %v), want the recompute's %v", toks, last.Finish, last.Err, want)
			}
			onboarded, recomputed := tc.onboarded, tc.recomputed
			if onboarded < 0 { // some of the 9 blocks: the ones that arrived whole in time
				onboarded, recomputed = last.Usage.OnboardedTokens, 36-last.Usage.OnboardedTokens
				if onboarded <= 0 || onboarded >= 36 {
					t.Errorf("%d tokens onboarded, want some of the 36 but not all", onboarded)
				}
			}
			if u := last.Usage; u.OnboardedTokens != onboarded || u.CachedTokens != onboarded {
				t.Errorf("usage %+v, want %d tokens onboarded and cached", u, onboarded)
			}
			st := e.Stats()
			if st.OnboardedTokens != uint64(onboarded) || st.RecomputedTokens != uint64(recomputed) || st.CacheErrors != uint64(tc.errs) {
				t.Errorf("%d tokens onboarded, %d recomputed, %d cache errors; want %d, %d, %d",
					st.OnboardedTokens, st.RecomputedTokens, st.CacheErrors, onboarded, recomputed, tc.errs)
			}
			for name, v := range map[string]float64{
				"kvstrata_engine_onboarded_tokens_total":  float64(onboarded),
				"kvstrata_engine_recomputed_tokens_total": float64(recomputed),
				"kvstrata_engine_cache_failures_total":    float64(tc.errs),
				"kvstrata_engine_onboard_blocks_total":    float64(onboarded / 4),
			} {
				if got := max(counter(t, reg, name), 0); got != v {
					t.Errorf("%s = %v, want %v", name, got, v)
				}
			}
			for _, op := range []string{"lookup", "load"} {
				if got := counter(t, reg, "kvstrata_engine_cache_errors_total", "op", op); got != tc.connErrs[op] {
					t.Errorf("kvstrata_engine_cache_errors_total{op=%q} = %v, want %v", op, got, tc.connErrs[op])
				}
			}
		})
	}
}

// proxy forwards TCP connections to an address of a cache node, and can
// stall them (bytes are held, not forwarded; StallAfter lets so many
// bytes from the node through first) or go down (every connection is
// closed, none accepted): a cache that is slow or gone, on real sockets.
type proxy struct {
	l  net.Listener
	wg sync.WaitGroup

	mu     sync.Mutex
	target string
	stall  chan struct{} // while stalled; closed to let the bytes go
	left   int           // bytes from the node that still pass while stalled
	conns  map[net.Conn]struct{}
	closed bool
}

// startProxy listens for connections to forward to target, which may be
// set later (SetTarget), before the first connection.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{target: target, l: l, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Down)
	return p
}

func (p *proxy) Addr() string { return p.l.Addr().String() }

func (p *proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		u, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			u.Close()
			return
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(u, c, false)
		go p.pipe(c, u, true)
	}
}

func (p *proxy) pipe(dst, src net.Conn, fromNode bool) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for data := buf[:n]; len(data) > 0; {
			k := p.allow(fromNode, len(data))
			if k == 0 {
				return
			}
			if _, err := dst.Write(data[:k]); err != nil {
				return
			}
			data = data[k:]
		}
		if err != nil {
			return
		}
	}
}

// allow returns how many of want bytes may be forwarded now, waiting while
// the proxy is stalled; 0 once it is down.
func (p *proxy) allow(fromNode bool, want int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		switch {
		case p.closed:
			return 0
		case p.stall == nil:
			return want
		case p.left > 0 && !fromNode:
			return want
		case p.left > 0:
			n := min(want, p.left)
			p.left -= n
			return n
		}
		stall := p.stall
		p.mu.Unlock()
		<-stall
		p.mu.Lock()
	}
}

// Stall holds every byte from now on.
func (p *proxy) Stall() { p.StallAfter(0) }

// StallAfter lets n more bytes from the node through (and what the
// client sends meanwhile), then holds every byte.
func (p *proxy) StallAfter(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stall == nil && !p.closed {
		p.stall = make(chan struct{})
	}
	p.left = n
}

// Down closes every connection and the listener, and waits for the
// proxy's goroutines.
func (p *proxy) Down() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.l.Close()
		if p.stall != nil {
			close(p.stall)
			p.stall = nil
		}
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// verifier is a sim model that checks, before each step, that every full
// block of every sequence's Prefix holds the sim model's bytes for its
// hash: the KV found in the pool, onboarded from kvstrata or computed
// earlier is the KV the model reads.
type verifier struct {
	model.Model
	mu     sync.Mutex
	blocks int // full blocks checked
	bad    []string
}

func (v *verifier) check(batch []model.Seq) {
	l := v.Layout()
	ns := l.Namespace.ID()
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, s := range batch {
		hs := l.Namespace.Hashes(s.Tokens[:s.Cached])
		for i, b := range s.Prefix {
			if !b.Full(l) {
				continue
			}
			v.blocks++
			if i >= len(hs) || b.Hash != hs[i] {
				v.bad = append(v.bad, fmt.Sprintf("prefix block %d is named %v, not its tokens' hash", i, b.Hash))
				continue
			}
			for j, layer := range b.Layers {
				if !sim.Verify(ns, b.Hash, j, layer) {
					v.bad = append(v.bad, fmt.Sprintf("prefix block %d (%v) layer %d holds other bytes", i, b.Hash, j))
				}
			}
		}
	}
}

func (v *verifier) Prefill(ctx context.Context, batch []model.Seq) (model.Result, error) {
	v.check(batch)
	return v.Model.Prefill(ctx, batch)
}

func (v *verifier) Decode(ctx context.Context, batch []model.Seq) (model.Result, error) {
	v.check(batch)
	return v.Model.Decode(ctx, batch)
}

func (v *verifier) report(t testing.TB) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, b := range v.bad {
		if i == 10 {
			t.Errorf("… and %d more", len(v.bad)-10)
			break
		}
		t.Error("the model read " + b)
	}
}

// simWant is what the sim model generates after p, n tokens.
func simWant(m *sim.Model, p []uint32, n int) []uint32 {
	toks := slices.Clone(p)
	for range n {
		toks = append(toks, m.Next(toks))
	}
	return toks[len(p):]
}

// After requests finish, the node holds every full block of their prompts
// and of the text they generated, each once, with its parent, and with
// the bytes the sim model derives from its name.
func TestOffloadedBlocksReachTheNode(t *testing.T) {
	m := simModel(t, 0)
	l := m.Layout()
	ns := l.Namespace.ID()
	n := startNode(t)
	cl := dial(t, n.Addr)
	e := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)})

	shared := tokens(64, 7)
	prompts := [][]uint32{
		append(slices.Clone(shared), tokens(30, 8)...),
		append(slices.Clone(shared), tokens(45, 9)...), // shares 4 blocks with the first
		tokens(50, 10),
	}
	distinct := map[index.Hash]bool{}
	var seqs [][]uint32
	for _, p := range prompts {
		toks, last := run(t, e, sched.Request{Prompt: p, MaxTokens: 40, IgnoreEOS: true})
		if !slices.Equal(toks, simWant(m, p, 40)) || last.Err != nil {
			t.Fatalf("generated %v (%v), want the model's", toks, last.Err)
		}
		all := append(slices.Clone(p), toks[:len(toks)-1]...) // the last token has no KV
		seqs = append(seqs, all)
		for _, h := range l.Namespace.Hashes(all) {
			distinct[h] = true
		}
	}
	for _, all := range seqs {
		hs := waitHeld(t, cl, l, all)
		keys := make([]index.Key, len(hs))
		for i, h := range hs {
			keys[i] = index.Key{NS: ns, Hash: h}
		}
		res, err := cl.Get(context.Background(), keys)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			switch {
			case !r.Found:
				t.Errorf("block %d of %d: not found", i, len(hs))
			case i == 0 && r.HasParent, i > 0 && (!r.HasParent || r.Parent != hs[i-1]):
				t.Errorf("block %d: parent %v (%v), want %v", i, r.Parent, r.HasParent, hs[max(i-1, 0)])
			case len(r.Data) != l.BlockBytes() || !sim.VerifyBlock(ns, hs[i], l.Namespace.Layout.Layers, r.Data):
				t.Errorf("block %d: its %d bytes are not the block's KV", i, len(r.Data))
			}
		}
	}
	if st := e.Stats(); st.OffloadedBlocks != uint64(len(distinct)) {
		t.Errorf("%d blocks offloaded, want each of the %d distinct full blocks once", st.OffloadedBlocks, len(distinct))
	}
}

// sharedPrefixLoad is 64 requests in groups sharing a long prefix (a system
// prompt, a document, a conversation so far), each with a suffix of its
// own: groups × perGroup requests of prefix + suffix tokens, generating
// gen tokens each. Each round has other suffixes and the same prefixes.
type sharedPrefixLoad struct {
	groups, perGroup, prefix, suffix, gen int
	round                                 int
}

func (w sharedPrefixLoad) requests() []sched.Request {
	var out []sched.Request
	for g := range w.groups {
		pre := tokens(w.prefix, uint32(1000+g))
		for i := range w.perGroup {
			p := append(slices.Clone(pre), tokens(w.suffix, uint32(10000*(w.round+1)+g*w.perGroup+i))...)
			out = append(out, sched.Request{ID: fmt.Sprintf("g%d-%d", g, i), Prompt: p, MaxTokens: w.gen, IgnoreEOS: true})
		}
	}
	return out
}

// result is one request's end.
type result struct {
	toks []uint32
	last sched.Output
}

// runAll runs reqs concurrently on e and returns their results in order.
func runAll(t testing.TB, e *sched.Engine, reqs []sched.Request) []result {
	t.Helper()
	out := make([]result, len(reqs))
	var wg sync.WaitGroup
	errs := make(chan error, len(reqs))
	for i, req := range reqs {
		wg.Go(func() {
			ch, err := e.Generate(context.Background(), req)
			if err != nil {
				errs <- fmt.Errorf("request %s: %w", req.ID, err)
				return
			}
			for o := range ch {
				out[i].toks = append(out[i].toks, o.Tokens...)
				if o.Finish != "" {
					out[i].last = o
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return out
}

// 64 concurrent requests with shared prefixes on an engine with a small
// pool, its cache warmed by another engine: every request completes with
// the model's tokens, no block the model reads holds other bytes than its
// own, the pool ends with no block held, and closing the engine and its
// connector leaves no goroutine behind.
func TestSixtyFourConcurrentRequestsWithSharedPrefixes(t *testing.T) {
	n := startNode(t)
	cl := dial(t, n.Addr)
	w := sharedPrefixLoad{groups: 8, perGroup: 8, prefix: 160, suffix: 40, gen: 24}
	reqs := w.requests()
	m := simModel(t, 200)
	l := m.Layout()

	// A first engine computes half the groups' prompts, which reach the node.
	warm := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)})
	var warmed []sched.Request
	for i, r := range reqs {
		if i%(2*w.perGroup) == 0 {
			warmed = append(warmed, sched.Request{Prompt: r.Prompt, MaxTokens: 1})
		}
	}
	runAll(t, warm, warmed)
	for _, r := range warmed {
		waitHeld(t, cl, l, r.Prompt)
	}
	warm.Close()

	goroutines := clientGoroutines()
	conn := newConn(t, n.Addr, nil)
	v := &verifier{Model: m}
	// 120 blocks of 16 tokens: 8 requests' worth (each needs up to 14),
	// so requests wait for blocks, and running ones are preempted.
	e, err := sched.New(sched.Config{Model: v, Connector: conn, Blocks: 120, MaxNumSeqs: 16, MaxNumBatchedTokens: 512,
		CacheTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res := runAll(t, e, reqs)
	for i, r := range res {
		if r.last.Finish != sched.FinishLength || r.last.Err != nil || !slices.Equal(r.toks, simWant(m, reqs[i].Prompt, w.gen)) {
			t.Errorf("request %s: finish %q, err %v, tokens %v; want %d tokens of the model's", reqs[i].ID, r.last.Finish, r.last.Err, r.toks, w.gen)
		}
	}
	v.report(t)
	st := e.Stats()
	if st.Pool.Free != st.Pool.Blocks || st.Running+st.Waiting+st.Onboarding != 0 {
		t.Errorf("after every request ended: %d of %d pool blocks free, %d running, %d waiting, %d onboarding; want all free, none",
			st.Pool.Free, st.Pool.Blocks, st.Running, st.Waiting, st.Onboarding)
	}
	if st.OnboardedTokens == 0 || v.blocks == 0 {
		t.Errorf("%d tokens onboarded, %d prefix blocks verified: the test onboarded nothing", st.OnboardedTokens, v.blocks)
	}
	t.Logf("%d steps, %d preemptions, %d tokens onboarded, %d recomputed, %d cache errors, %d blocks offloaded, %d prefix blocks verified",
		st.Steps, st.Preemptions, st.OnboardedTokens, st.RecomputedTokens, st.CacheErrors, st.OffloadedBlocks, v.blocks)

	e.Close()
	if err := conn.Close(); err != nil {
		t.Errorf("closing the connector: %v", err)
	}
	// Goroutines of the engine and of its connector's clients end with
	// Close (gRPC's may take a moment after its connection closed).
	for end := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		left := clientGoroutines()
		if len(left) <= len(goroutines) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("a minute after Close, %d goroutines of engines and cache clients, %d before the engine:\n%s",
				len(left), len(goroutines), strings.Join(left, "\n\n"))
		}
	}
}

// clientGoroutines returns the stacks of the goroutines of the engine
// loop, of kvconn, and of cache clients (not the cache node's), but the
// caller's.
func clientGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "runtime.Stack(") {
			continue
		}
		for _, mark := range []string{"/engine/sched.", "/engine/kvconn.", "/api/client.", "transport.(*http2Client)", "grpc.(*ClientConn)", "grpc.(*addrConn)"} {
			if strings.Contains(g, mark) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// A prompt prefilled by one engine and decoded by another, handed over
// through a cache node the prefill request names (not either worker's
// own): the decode side onboards every full block of the prompt from that
// node and generates what one engine computing it all does.
func TestTinyDisaggregatedThroughANamedNode(t *testing.T) {
	m := tinyModel(t)
	l := m.Layout()
	p := tokens(38, 11) // 9 full blocks and 2 tokens
	req := sched.Request{Prompt: p, MaxTokens: 10, IgnoreEOS: true, Sampling: sched.Sampling{Temperature: 0.8, Seed: 3}}
	want := recompute(t, m, req)

	own, between, decodeOwn := startNode(t), startNode(t), startNode(t)
	prefill := newEngine(t, sched.Config{Model: m, Connector: newConn(t, own.Addr, nil)})
	toks, last := run(t, prefill, sched.Request{Prompt: p, MaxTokens: 1, Sampling: req.Sampling,
		Transfer: &sched.KVTransferParams{DoRemoteDecode: true, CacheNode: between.Addr}})
	tp := last.Transfer
	if last.Err != nil || tp == nil || len(tp.BlockHashes) != 9 || tp.CacheNode != between.Addr || !slices.Equal(toks, want[:1]) {
		t.Fatalf("prefill: tokens %v, err %v, params %+v; want the first token and 9 blocks at %s", toks, last.Err, tp, between.Addr)
	}
	hs := l.Namespace.Hashes(p)
	if got := held(t, dial(t, between.Addr), l.Namespace.ID(), hs); got != 9 {
		t.Errorf("the named node holds %d of the prompt's 9 blocks", got)
	}
	if got := held(t, dial(t, own.Addr), l.Namespace.ID(), hs); got != 0 {
		t.Errorf("the prefill worker's own node holds %d of the prompt's blocks, want none (the handoff went to the named node)", got)
	}

	decode := newEngine(t, sched.Config{Model: m, Connector: newConn(t, decodeOwn.Addr, nil)})
	dreq := req
	dreq.Transfer = tp
	dtoks, dlast := run(t, decode, dreq)
	if !slices.Equal(dtoks, want) || dlast.Err != nil {
		t.Fatalf("decode: %v (err %v), want the recompute's %v", dtoks, dlast.Err, want)
	}
	if u := dlast.Usage; u.OnboardedTokens != 36 || u.CachedTokens != 36 {
		t.Errorf("decode usage %+v, want the 36 tokens of 9 blocks onboarded", u)
	}
	if st := decode.Stats(); st.RecomputedTokens != 0 || st.CacheErrors != 0 {
		t.Errorf("decode: %d tokens recomputed, %d cache errors; want none", st.RecomputedTokens, st.CacheErrors)
	}
}

// A request onboarding from a cache whose data plane hangs, with a
// CacheTimeout that would never end it, is ended by its cancellation, and
// the engine's Close ends another: neither waits for the cache, and the
// pool holds no block after.
func TestCancelAndCloseWhileTheCacheHangs(t *testing.T) {
	m := tinyModel(t)
	l := m.Layout()
	px := startProxy(t, "")
	n := nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20, DataAddr: px.Addr()})
	px.SetTarget(n.DataAddr)
	p := tokens(37, 13)
	warm := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil)})
	run(t, warm, sched.Request{Prompt: p, MaxTokens: 1})
	waitHeld(t, dial(t, n.Addr), l, p)
	px.Stall()

	e := newEngine(t, sched.Config{Model: m, Connector: newConn(t, n.Addr, nil), CacheTimeout: time.Hour})
	onboarding := func(want int) {
		t.Helper()
		eventually(t, fmt.Sprintf("%d requests onboarding", want), func() bool { return e.Stats().Onboarding == want })
	}
	end := func(ch <-chan sched.Output) sched.Output {
		t.Helper()
		for {
			select {
			case o := <-ch:
				if o.Finish != "" {
					return o
				}
			case <-time.After(time.Minute):
				t.Fatal("no last Output a minute after the request was ended")
			}
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	a, err := e.Generate(ctx, sched.Request{Prompt: p, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	onboarding(1)
	cancel()
	if o := end(a); o.Finish != sched.FinishAbort || !errors.Is(o.Err, context.Canceled) {
		t.Errorf("the cancelled request: finish %q, err %v; want abort, context.Canceled", o.Finish, o.Err)
	}
	if st := e.Stats(); st.Pool.Free != st.Pool.Blocks || st.Onboarding != 0 {
		t.Errorf("after the cancellation: %d of %d blocks free, %d onboarding", st.Pool.Free, st.Pool.Blocks, st.Onboarding)
	}

	b, err := e.Generate(context.Background(), sched.Request{Prompt: p, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	onboarding(1)
	closed := make(chan struct{})
	go func() { e.Close(); close(closed) }()
	if o := end(b); o.Finish != sched.FinishAbort || !errors.Is(o.Err, sched.ErrClosed) {
		t.Errorf("the request at Close: finish %q, err %v; want abort, ErrClosed", o.Finish, o.Err)
	}
	<-closed
	if st := e.Stats(); st.Pool.Free != st.Pool.Blocks {
		t.Errorf("after Close: %d of %d blocks free", st.Pool.Free, st.Pool.Blocks)
	}
}

// lookupErrs records the error of every Lookup of the connector it wraps.
type lookupErrs struct {
	sched.Connector
	mu   sync.Mutex
	errs []error
}

func (c *lookupErrs) Lookup(ctx context.Context, ns index.NamespaceID, hs []index.Hash) (int, error) {
	n, err := c.Connector.Lookup(ctx, ns, hs)
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
	return n, err
}

// A cache node that goes silent (its connections hold every byte, as a
// partition that drops packets or a hung process does) costs the first
// request its CacheTimeout; the next ones are not sent to it while it
// backs off, as an unreachable one would be: they fail over to a
// recompute at once instead of each waiting out its CacheTimeout.
func TestASilentCacheBacksOff(t *testing.T) {
	m := simModel(t, 0)
	// Proxies in front of the node's gRPC service and of its data plane
	// (which its Info names), so that both go silent.
	dp := startProxy(t, "")
	n := nodetest.Start(t, nodetest.Options{DRAMBytes: 64 << 20, DataAddr: dp.Addr()})
	dp.SetTarget(n.DataAddr)
	px := startProxy(t, n.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A backoff no loaded machine outlasts between two requests.
	kc, err := kvconn.New(ctx, kvconn.Config{Addr: px.Addr(), Logger: slog.New(slog.DiscardHandler),
		Backoff: time.Hour, CloseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Close() })
	conn := &lookupErrs{Connector: kc}
	e := newEngine(t, sched.Config{Model: m, Connector: conn, CacheTimeout: 300 * time.Millisecond})
	px.Stall()
	dp.Stall()

	for i := range 3 {
		p := tokens(40, uint32(20+i))
		toks, last := run(t, e, sched.Request{Prompt: p, MaxTokens: 3})
		if !slices.Equal(toks, simWant(m, p, 3)) || last.Err != nil {
			t.Fatalf("request %d: %v (%v), want the model's tokens", i, toks, last.Err)
		}
	}
	if st := e.Stats(); st.CacheErrors != 3 {
		t.Errorf("%d cache errors, want 3", st.CacheErrors)
	}
	conn.mu.Lock()
	defer conn.mu.Unlock()
	if len(conn.errs) != 3 || !errors.Is(conn.errs[0], context.DeadlineExceeded) {
		t.Fatalf("lookups failed with %v; want 3, the first past its deadline", conn.errs)
	}
	for i, err := range conn.errs[1:] {
		if !errors.Is(err, kvconn.ErrCacheDown) {
			t.Errorf("lookup %d: %v, want kvconn.ErrCacheDown (not asked: the node is backing off)", i+2, err)
		}
	}
}

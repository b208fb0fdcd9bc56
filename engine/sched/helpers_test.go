package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
)

// newSim is a sim model on a virtual clock: its steps take no wall time.
func newSim(t testing.TB) *sim.Model {
	t.Helper()
	clk := sim.NewVirtualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m, err := sim.New(sim.Config{Sleep: clk.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// newEngine starts an engine closed at the test's end.
func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// prompt is n tokens, different for each salt.
func prompt(n int, salt uint32) []uint32 {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i)*2654435761 + salt*7919
	}
	return toks
}

// want is what the sim model generates after p, n tokens.
func want(m *sim.Model, p []uint32, n int) []uint32 {
	toks := slices.Clone(p)
	for range n {
		toks = append(toks, m.Next(toks))
	}
	return toks[len(p):]
}

// collect reads ch to its end: every token, and the last Output.
func collect(t testing.TB, ch <-chan Output) ([]uint32, Output) {
	t.Helper()
	var toks []uint32
	deadline := time.After(time.Minute)
	for {
		select {
		case o, ok := <-ch:
			if !ok {
				t.Fatal("the channel closed without a last Output")
			}
			toks = append(toks, o.Tokens...)
			if o.Finish != "" {
				if _, more := <-ch; more {
					t.Fatal("an Output after the last one")
				}
				return toks, o
			}
		case <-deadline:
			t.Fatal("no last Output within a minute")
		}
	}
}

// generate runs req to its end.
func generate(t testing.TB, e *Engine, req Request) ([]uint32, Output) {
	t.Helper()
	ch, err := e.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return collect(t, ch)
}

// call is one model call a recorder saw.
type call struct {
	step   uint64 // the engine's iteration
	decode bool
	seqs   []model.Seq // Tokens and Cached as given (Tokens not cloned: read the lengths)
}

func (c call) tokens() int {
	n := 0
	for _, s := range c.seqs {
		n += len(s.Tokens) - s.Cached
	}
	return n
}

// recorder is a model that records every batch it is given, and checks
// that every full block of each sequence's Prefix holds the sim model's
// bytes for its hash: the KV the engine kept, found or onboarded is the
// KV the model reads.
type recorder struct {
	model.Model
	mu     sync.Mutex
	calls  []call
	badKV  []string
	blocks int // prefix blocks checked
	// engine, if set, numbers the calls by iteration (the model runs on
	// the loop's goroutine, so it may read the loop's counters).
	engine *Engine
}

func (r *recorder) record(decode bool, batch []model.Seq) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := call{decode: decode, seqs: slices.Clone(batch)}
	if r.engine != nil {
		c.step = r.engine.counters.Steps
	}
	r.calls = append(r.calls, c)
	l := r.Layout()
	ns := l.Namespace.ID()
	for _, s := range batch {
		hs := l.Namespace.Hashes(s.Tokens[:s.Cached])
		for i, b := range s.Prefix {
			if !b.Full(l) {
				continue
			}
			r.blocks++
			if i >= len(hs) || b.Hash != hs[i] || len(b.Layers) != l.Namespace.Layout.Layers {
				r.badKV = append(r.badKV, fmt.Sprintf("block %d named %v, want %v", i, b.Hash, hs[i]))
				continue
			}
			for j, layer := range b.Layers {
				if !sim.Verify(ns, b.Hash, j, layer) {
					r.badKV = append(r.badKV, fmt.Sprintf("block %d (%v) layer %d: wrong bytes", i, b.Hash, j))
				}
			}
		}
	}
}

// checkKV fails t if the model was given a block with the wrong bytes.
func (r *recorder) checkKV(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.badKV {
		t.Error("the model read " + b)
	}
}

func (r *recorder) Prefill(ctx context.Context, batch []model.Seq) (model.Result, error) {
	r.record(false, batch)
	return r.Model.Prefill(ctx, batch)
}

func (r *recorder) Decode(ctx context.Context, batch []model.Seq) (model.Result, error) {
	r.record(true, batch)
	return r.Model.Decode(ctx, batch)
}

// iterations groups the calls by the engine's iteration (r.engine must be
// set).
func (r *recorder) iterations() [][]call {
	r.mu.Lock()
	defer r.mu.Unlock()
	var its [][]call
	for i, c := range r.calls {
		if i == 0 || c.step != r.calls[i-1].step {
			its = append(its, nil)
		}
		its[len(its)-1] = append(its[len(its)-1], c)
	}
	return its
}

// gate is a model whose every step waits for the test: it announces the
// step on entered, then runs it once released (or fails when ctx ends).
type gate struct {
	model.Model
	entered chan bool // true for a decode
	release chan struct{}
}

func newGate(m model.Model) *gate {
	return &gate{Model: m, entered: make(chan bool, 100), release: make(chan struct{})}
}

func (g *gate) wait(ctx context.Context, decode bool) error {
	g.entered <- decode
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) Prefill(ctx context.Context, batch []model.Seq) (model.Result, error) {
	if err := g.wait(ctx, false); err != nil {
		return model.Result{}, err
	}
	return g.Model.Prefill(ctx, batch)
}

func (g *gate) Decode(ctx context.Context, batch []model.Seq) (model.Result, error) {
	if err := g.wait(ctx, true); err != nil {
		return model.Result{}, err
	}
	return g.Model.Decode(ctx, batch)
}

// open lets the gated model run freely.
func (g *gate) open() {
	go func() {
		for range g.entered {
		}
	}()
	close(g.release)
}

// mapConn is a Connector over a map: what it is given to offload or store
// it holds at once. Its faults are set by the test before use.
type mapConn struct {
	mu     sync.Mutex
	blocks map[index.Key][]byte
	// offloads and stores record the calls, nodes the Store and Load nodes.
	offloads [][]Block
	stores   [][]Block
	nodes    []string
	lookups  int

	// Faults: loadOnly loads at most that many blocks (≥ 0), loadErr fails
	// Load after loadOnly blocks, hang makes Lookup and Load wait for ctx
	// (or for unhang), lookupErr fails Lookup, storeErr fails Store.
	loadOnly  int
	loadErr   error
	lookupErr error
	storeErr  error
	hang      bool
	unhang    chan struct{}
	hanging   chan struct{} // receives when a call starts hanging
}

func newMapConn() *mapConn {
	return &mapConn{blocks: make(map[index.Key][]byte), loadOnly: -1, unhang: make(chan struct{}), hanging: make(chan struct{}, 10)}
}

func (c *mapConn) wait(ctx context.Context) error {
	c.mu.Lock()
	hang := c.hang
	c.mu.Unlock()
	if !hang {
		return nil
	}
	c.hanging <- struct{}{}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.unhang:
		return nil
	}
}

func (c *mapConn) Lookup(ctx context.Context, ns index.NamespaceID, hashes []index.Hash) (int, error) {
	if err := c.wait(ctx); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lookups++
	if c.lookupErr != nil {
		return 0, c.lookupErr
	}
	for i, h := range hashes {
		if _, ok := c.blocks[index.Key{NS: ns, Hash: h}]; !ok {
			return i, nil
		}
	}
	return len(hashes), nil
}

func (c *mapConn) Load(ctx context.Context, node string, ns index.NamespaceID, hashes []index.Hash, dst func(int) []byte) (int, error) {
	if err := c.wait(ctx); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes = append(c.nodes, "load:"+node)
	for i, h := range hashes {
		if c.loadOnly >= 0 && i >= c.loadOnly {
			return i, c.loadErr
		}
		b, ok := c.blocks[index.Key{NS: ns, Hash: h}]
		if !ok {
			return i, nil
		}
		copy(dst(i), b)
	}
	return len(hashes), nil
}

func (c *mapConn) Offload(ns index.NamespaceID, blocks []Block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offloads = append(c.offloads, blocks)
	for _, b := range blocks {
		c.blocks[index.Key{NS: ns, Hash: b.Hash}] = b.Data
	}
}

// mapConnNode is the address of the mapConn's own node, where Store
// stores blocks when it is given none.
const mapConnNode = "127.0.0.1:7400"

func (c *mapConn) Store(ctx context.Context, node string, ns index.NamespaceID, blocks []Block) (string, error) {
	if err := c.wait(ctx); err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes = append(c.nodes, "store:"+node)
	if c.storeErr != nil {
		return "", c.storeErr
	}
	c.stores = append(c.stores, blocks)
	for _, b := range blocks {
		c.blocks[index.Key{NS: ns, Hash: b.Hash}] = b.Data
	}
	if node == "" {
		node = mapConnNode
	}
	return node, nil
}

// set changes the connector's faults under its lock.
func (c *mapConn) set(f func(c *mapConn)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

var errInjected = errors.New("injected cache fault")

var _ Connector = (*mapConn)(nil)

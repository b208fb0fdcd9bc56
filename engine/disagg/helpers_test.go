package disagg_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/engine/kvconn"
	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// tinyConfig is the tests' model: tiny's whole structure at a width that
// keeps -race quick, and a vocabulary the synthetic prompts' ids fit.
var tinyConfig = tiny.Config{Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, Hidden: 64,
	Vocab: 4096, BlockTokens: 16, ContextLen: 8192, Workers: 1}

// quiet is a logger for the parts whose lines the tests do not read.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startCache serves a cache node in the process, as kvstrata serve runs
// one: gRPC, the TCP data plane, DRAM over an SSD tier in a temporary
// directory, and a one-node Raft cluster (whose directory lists a block
// only once the change is committed). It returns the node's gRPC address.
// extra are more settings, flag name then value.
func startCache(t testing.TB, extra ...string) string {
	t.Helper()
	flags := map[string]string{"data-dir": t.TempDir(), "dram-capacity": "64MiB", "ssd-capacity": "64MiB",
		"listen-grpc": "127.0.0.1:0", "listen-data": "127.0.0.1:0", "listen-resp": "127.0.0.1:0", "listen-http": "127.0.0.1:0",
		"cluster-raft-addr": freeport.Addr(t)}
	for i := 0; i+1 < len(extra); i += 2 {
		flags[extra[i]] = extra[i+1]
	}
	l, err := config.Load("", func(string) string { return "" }, flags)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	n, err := daemon.New(l.Config, daemon.Options{Logger: quiet(), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Stop(ctx)
	})
	for deadline := time.Now().Add(30 * time.Second); n.Ready() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the cache node is not ready after 30 s: %v", n.Ready())
		}
	}
	return n.Addrs().GRPC
}

// worker is one worker's engine and, if it has a cache, its connector.
type worker struct {
	*sched.Engine
	conn *kvconn.Conn
	reg  *prometheus.Registry
	bb   int // the model's KV bytes per block
}

func (w *worker) blockBytes() int { return w.bb }

// newWorker starts an engine on its own tiny model (the same weights as
// every other's), with a connector to the cache node at cache unless
// cache is empty. Both close when the test ends.
func newWorker(t testing.TB, cache string) *worker {
	t.Helper()
	return newWorkerOf(t, tinyConfig, cache)
}

// newWorkerOf is newWorker with a model of cfg.
func newWorkerOf(t testing.TB, mcfg tiny.Config, cache string) *worker {
	t.Helper()
	m, err := tiny.New(mcfg)
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{reg: prometheus.NewRegistry(), bb: m.Layout().BlockBytes()}
	cfg := sched.Config{Model: m, Blocks: 1024, Registerer: w.reg, Logger: quiet()}
	if cache != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.conn, err = kvconn.New(ctx, kvconn.Config{Addr: cache, Registerer: w.reg, ModelName: "tiny", Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Connector = w.conn
	}
	w.Engine, err = sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.Close()
		if w.conn != nil {
			w.conn.Close()
		}
	})
	return w
}

// generate runs req to its end and returns its tokens and last Output,
// failing the test if it is refused.
func (w *worker) generate(t testing.TB, req sched.Request) ([]uint32, sched.Output) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ch, err := w.Generate(ctx, req)
	if err != nil {
		t.Fatalf("request %s: %v", req.ID, err)
	}
	var toks []uint32
	var last sched.Output
	for o := range ch {
		toks = append(toks, o.Tokens...)
		last = o
	}
	return toks, last
}

// prompt is n token ids of the tests' vocabulary, different for each seed.
func prompt(n int, seed uint32) []uint32 {
	p := make([]uint32, n)
	x := seed*2654435761 + 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		p[i] = x % uint32(tinyConfig.Vocab)
	}
	return p
}

// handoff prefills p on the prefill worker for a remote decode, at node
// (the prefill worker's own cache if empty), and returns the params its
// answer names, failing the test unless it ends as a one-token prefill.
func handoff(t testing.TB, prefill *worker, p []uint32, node string) (*sched.KVTransferParams, uint32) {
	t.Helper()
	toks, last := prefill.generate(t, sched.Request{ID: "prefill", Prompt: p, MaxTokens: 1,
		Transfer: &sched.KVTransferParams{DoRemoteDecode: true, CacheNode: node}})
	if last.Err != nil || len(toks) != 1 || last.Transfer == nil {
		t.Fatalf("prefill: tokens %v, finish %q, err %v, params %+v", toks, last.Finish, last.Err, last.Transfer)
	}
	return last.Transfer, toks[0]
}

// keys are the cache keys of the blocks params name.
func keys(t testing.TB, params *sched.KVTransferParams) []index.Key {
	t.Helper()
	ns, err := index.ParseNamespaceID(params.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]index.Key, len(params.BlockHashes))
	for i, s := range params.BlockHashes {
		h, err := index.ParseHash(s)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = index.Key{NS: ns, Hash: h}
	}
	return out
}

// held is how many of keys the node at addr itself holds (Get, no
// directory involved).
func held(t testing.TB, addr string, keys []index.Key) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	return len(slices.DeleteFunc(res, func(r client.Result) bool { return !r.Found }))
}

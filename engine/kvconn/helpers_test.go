package kvconn

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/api/dataplane"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/server"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// blockSize is the engine block size of the tests: small, but several
// data-plane reads long.
const blockSize = 64 << 10

// prompt is one prompt's chain of full blocks with deterministic bytes.
type prompt struct {
	ns     index.NamespaceID
	hashes []index.Hash
	data   [][]byte
}

func newPrompt(ns index.NamespaceID, seed uint64, n int) prompt {
	p := prompt{ns: ns}
	for i := range n {
		h := index.Hash(seed<<20 | uint64(i+1))
		d := make([]byte, blockSize)
		for j := range d {
			d[j] = byte(uint64(i*131+j*7) ^ seed)
		}
		p.hashes = append(p.hashes, h)
		p.data = append(p.data, d)
	}
	return p
}

// blocks returns blocks [from, to) as the engine hands them over, with
// their own copies of the bytes (the Conn owns them).
func (p prompt) blocks(from, to int) []sched.Block {
	var out []sched.Block
	for i := from; i < to; i++ {
		b := sched.Block{Hash: p.hashes[i], Data: bytes.Clone(p.data[i])}
		if i > 0 {
			b.Parent, b.HasParent = p.hashes[i-1], true
		}
		out = append(out, b)
	}
	return out
}

// pool is the engine's block memory for one Load: one buffer per block.
type pool [][]byte

func newPool(n int) pool {
	p := make(pool, n)
	for i := range p {
		p[i] = make([]byte, blockSize)
	}
	return p
}

func (p pool) dst(i int) []byte { return p[i] }

// checkLoaded fails the test unless the first n buffers hold the prompt's
// blocks byte for byte.
func checkLoaded(t *testing.T, got pool, p prompt, n int) {
	t.Helper()
	for i := range n {
		if !bytes.Equal(got[i], p.data[i]) {
			t.Fatalf("block %d loaded with different bytes", i)
		}
	}
}

// newConn makes a Conn to addr whose metrics go to a registry of its own,
// closed when the test ends.
func newConn(t *testing.T, addr string, tune func(*Config)) (*Conn, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{Addr: addr, Registerer: reg, ModelName: "test-model", Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	if tune != nil {
		tune(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reg
}

// metric returns the value of the counter (or the sample count of the
// histogram) name whose labels include want, gathered from reg; 0 if
// there is none.
func metric(t *testing.T, reg *prometheus.Registry, name string, want ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			if !hasLabels(have, want) {
				continue
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// hasLabels reports whether have holds every name=value pair of kv (name,
// value, name, value, …), and model_name test-model.
func hasLabels(have map[string]string, kv []string) bool {
	if have["model_name"] != "test-model" {
		return false
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if have[kv[i]] != kv[i+1] {
			return false
		}
	}
	return true
}

// eventually polls cond until it holds, failing the test if it does not
// within a minute: long enough for anything these tests wait for on a
// loaded machine.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still not true after a minute: %s", what)
		}
	}
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// stoppableNode is a cache node, wired as api/nodetest wires one, that
// the test can stop and start again on the same gRPC and data-plane
// addresses (empty, as a restarted DRAM-only node is).
type stoppableNode struct {
	t              *testing.T
	Addr, DataAddr string

	mu   sync.Mutex
	N    *node.Node
	stop func()
}

func startStoppable(t *testing.T, addr string) *stoppableNode {
	s := &stoppableNode{t: t, Addr: addr, DataAddr: freeAddr(t)}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start serves the node; it must be stopped.
func (s *stoppableNode) Start() {
	t := s.t
	t.Helper()
	tr, err := dram.New(dram.Config{Capacity: 16 << 20, MaxBlockSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: tr}}})
	if err != nil {
		t.Fatal(err)
	}
	var limits node.Config
	limits.EnsureDefaults()
	n, err := node.New(h, limits)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatal(fmt.Errorf("listen again on %s: %w", s.Addr, err))
	}
	dl, err := tcp.New(tcp.Options{MaxBlockSize: int(limits.MaxBlockSize), MaxBlocks: limits.MaxBatchBlocks}).
		Listen(s.DataAddr, dataplane.NewHandler(n, nil))
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	server.Register(g, n, server.Options{Addrs: server.Addrs{GRPC: s.Addr, Data: dl.Addr(), Transport: "tcp"}})
	go g.Serve(lis)
	s.mu.Lock()
	s.N = n
	s.stop = func() {
		dl.Close()
		g.Stop()
		n.Close()
	}
	s.mu.Unlock()
}

// Stop stops the node, if it runs.
func (s *stoppableNode) Stop() {
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}

package respcluster_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/hung"
)

// cluster is nodes of MemStores, each serving its own keys over a real
// Keyspace gRPC server on loopback, and a directory that lists, for each
// key, the nodes whose store holds it (or what a test pins).
type cluster struct {
	t      testing.TB
	locals map[index.NodeID]resp.Store // each node's own keys
	stores map[index.NodeID]resp.Store // the cluster-wide stores
	peers  *respcluster.GRPCPeers

	mu     sync.Mutex
	addrs  map[index.NodeID]string
	conns  map[index.NodeID]*grpc.ClientConn
	keys   map[index.Key]string               // the keys the tests use, by block
	pinned map[index.Key][]respcluster.Holder // listed instead of the actual holders
	down   map[index.NodeID]bool              // members marked down
}

// newCluster starts n nodes whose requests to another node give up after
// 20 s without progress: never, on a working loopback.
func newCluster(t *testing.T, n int) *cluster { return newClusterTimeout(t, n, 20*time.Second) }

func newClusterTimeout(t testing.TB, n int, peerTimeout time.Duration) *cluster {
	return newClusterOf(t, n, peerTimeout, func() resp.Store { return resptest.NewMemStore() })
}

// newClusterOf starts n nodes whose own keys are in a store newStore
// returns.
func newClusterOf(t testing.TB, n int, peerTimeout time.Duration, newStore func() resp.Store) *cluster {
	c := &cluster{t: t, locals: map[index.NodeID]resp.Store{}, stores: map[index.NodeID]resp.Store{},
		addrs: map[index.NodeID]string{}, conns: map[index.NodeID]*grpc.ClientConn{},
		keys: map[index.Key]string{}, pinned: map[index.Key][]respcluster.Holder{},
		down: map[index.NodeID]bool{}}
	c.peers = respcluster.NewGRPCPeers(c.conn)
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, cc := range c.conns {
			cc.Close()
		}
	})
	for i := 1; i <= n; i++ {
		id := index.NodeID(i)
		local := newStore()
		g := grpc.NewServer()
		respcluster.Register(g, local)
		c.serve(id, g)
		st, err := respcluster.New(local, directory{c, id}, c.peers, &respcluster.Config{PeerTimeout: peerTimeout, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		c.locals[id], c.stores[id] = local, st
	}
	return c
}

// serve serves g as node id on a loopback port until the test ends.
func (c *cluster) serve(id index.NodeID, g *grpc.Server) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	go g.Serve(l)
	c.t.Cleanup(g.Stop)
	c.setAddr(id, l.Addr().String())
}

func (c *cluster) setAddr(id index.NodeID, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addrs[id] = addr
}

func (c *cluster) conn(id index.NodeID) (grpc.ClientConnInterface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[id]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient(c.addrs[id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c.conns[id] = cc
	return cc, nil
}

// key registers key, so that the directory can tell who holds its block.
func (c *cluster) key(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keys[index.RESPKey(key)] = key
	return key
}

// pin makes the directory list holders for key, whatever they hold.
func (c *cluster) pin(key string, holders ...respcluster.Holder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pinned[index.RESPKey(key)] = holders
}

// directory is node self's view of the cluster's directory: current.
type directory struct {
	c    *cluster
	self index.NodeID
}

func (d directory) Holders(k index.Key) []respcluster.Holder {
	d.c.mu.Lock()
	pinned, isPinned := d.c.pinned[k]
	key := d.c.keys[k]
	d.c.mu.Unlock()
	var out []respcluster.Holder
	if isPinned {
		for _, h := range pinned {
			if h.Node != d.self {
				out = append(out, h)
			}
		}
		return out
	}
	for id, local := range d.c.locals {
		if ok, _ := local.Exists(context.Background(), key); ok && id != d.self {
			out = append(out, respcluster.Holder{Node: id, Up: true})
		}
	}
	slices.SortFunc(out, func(a, b respcluster.Holder) int { return int(a.Node) - int(b.Node) })
	return out
}

// Members lists every node with an address, those in c.down marked down.
func (d directory) Members() ([]respcluster.Holder, index.NodeID) {
	d.c.mu.Lock()
	defer d.c.mu.Unlock()
	var out []respcluster.Holder
	for id := range d.c.addrs {
		out = append(out, respcluster.Holder{Node: id, Up: !d.c.down[id]})
	}
	return out, d.self
}

// quiet drops the stores' warnings of holders that do not answer, which
// some tests cause on purpose.
var quiet = slog.New(slog.DiscardHandler)

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func get(t *testing.T, s resp.Store, key string) (string, error) {
	t.Helper()
	v, release, err := s.View(ctx(t), key)
	if err != nil {
		return "", err
	}
	defer release()
	return string(v), nil
}

func mustGet(t *testing.T, s resp.Store, key, want string) {
	t.Helper()
	got, err := get(t, s, key)
	if err != nil || got != want {
		t.Fatalf("GET %s = %.40q, %v; want %.40q", key, got, err, want)
	}
}

func mustMiss(t *testing.T, s resp.Store, key string) {
	t.Helper()
	if got, err := get(t, s, key); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("GET %s = %.40q, %v; want a miss", key, got, err)
	}
}

func TestAKeyStoredThroughOneNodeIsFoundThroughEvery(t *testing.T) {
	c := newCluster(t, 3)
	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("kv bytes")); err != nil {
		t.Fatal(err)
	}
	for id, s := range c.stores {
		mustGet(t, s, k, "kv bytes")
		if ok, err := s.Exists(ctx(t), k); !ok || err != nil {
			t.Fatalf("EXISTS through node %d = %v, %v", id, ok, err)
		}
	}
	// Nothing was copied: node 1 alone holds it.
	for id, local := range c.locals {
		if ok, _ := local.Exists(ctx(t), k); ok != (id == 1) {
			t.Fatalf("node %d holds the key: %v", id, ok)
		}
	}
	mustMiss(t, c.stores[2], c.key("prompt:none"))
	if ok, err := c.stores[2].Exists(ctx(t), "prompt:none"); ok || err != nil {
		t.Fatalf("EXISTS of a key nowhere = %v, %v", ok, err)
	}
}

func TestALargeValueComesBackWholeInChunks(t *testing.T) {
	c := newCluster(t, 2)
	k := c.key("big")
	v := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16+7) // over three 1 MiB chunks
	if err := c.stores[1].Set(ctx(t), k, v); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[2], k, string(v))
	empty := c.key("empty")
	if err := c.stores[1].Set(ctx(t), empty, nil); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[2], empty, "")
}

func TestAnOverwriteThroughAnotherNodeLeavesNoOldValue(t *testing.T) {
	c := newCluster(t, 3)
	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := c.stores[2].Set(ctx(t), k, []byte("new")); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.stores {
		mustGet(t, s, k, "new")
	}
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds the old value")
	}
}

func TestDeleteRemovesEveryCopy(t *testing.T) {
	c := newCluster(t, 3)
	k := c.key("prompt:1")
	// Two copies, as two writes racing through two nodes can leave.
	for _, id := range []index.NodeID{1, 2} {
		if err := c.locals[id].Set(ctx(t), k, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := c.stores[3].Delete(ctx(t), k); !ok || err != nil {
		t.Fatalf("DEL through node 3 = %v, %v; want true", ok, err)
	}
	for _, s := range c.stores {
		mustMiss(t, s, k)
	}
	if ok, err := c.stores[3].Delete(ctx(t), k); ok || err != nil {
		t.Fatalf("second DEL = %v, %v; want false", ok, err)
	}
}

func TestConditionalSetsJudgeTheWholeCluster(t *testing.T) {
	c := newCluster(t, 2)
	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("first")); err != nil {
		t.Fatal(err)
	}
	cs, ok := c.stores[2].(resp.ConditionalSetter)
	if !ok {
		t.Fatalf("%T lost the local store's SetIf", c.stores[2])
	}
	if stored, err := cs.SetIf(ctx(t), k, []byte("nx"), false); stored || err != nil {
		t.Fatalf("SET NX through node 2 of node 1's key = %v, %v; want not stored", stored, err)
	}
	mustGet(t, c.stores[2], k, "first")
	if stored, err := cs.SetIf(ctx(t), k, []byte("xx"), true); !stored || err != nil {
		t.Fatalf("SET XX through node 2 of node 1's key = %v, %v; want stored", stored, err)
	}
	mustGet(t, c.stores[1], k, "xx")
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds the value SET XX replaced")
	}
	other := c.key("prompt:2")
	if stored, err := cs.SetIf(ctx(t), other, []byte("xx"), true); stored || err != nil {
		t.Fatalf("SET XX of a key nowhere = %v, %v; want not stored", stored, err)
	}
}

// TestAHungOrDeadHolderDelaysByOneTimeout: a holder that accepts
// connections and never answers, or that is gone, costs one peer timeout;
// then the next holder answers, and with none left the read is TRYAGAIN
// (not a miss, not a hang).
func TestAHungOrDeadHolderDelaysByOneTimeout(t *testing.T) {
	// Long enough for node 1's answer on a loaded machine, short enough
	// to wait for the hung node's a few times.
	c := newClusterTimeout(t, 3, 3*time.Second)
	c.setAddr(8, hung.Listener(t))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.setAddr(9, l.Addr().String())
	l.Close() // nothing listens there

	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("v")); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[2], k, "v") // node 2 is connected to node 1
	c.pin(k, respcluster.Holder{Node: 8, Up: true}, respcluster.Holder{Node: 9, Up: true}, respcluster.Holder{Node: 1, Up: true})
	mustGet(t, c.stores[2], k, "v")
	if ok, err := c.stores[2].Exists(ctx(t), k); !ok || err != nil {
		t.Fatalf("EXISTS past a hung holder = %v, %v", ok, err)
	}

	c.pin(k, respcluster.Holder{Node: 8, Up: true}, respcluster.Holder{Node: 9, Up: false})
	if got, err := get(t, c.stores[2], k); !errors.Is(err, resp.ErrUnavailable) || errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("GET with only a hung and a dead holder = %q, %v; want TRYAGAIN", got, err)
	} else if !strings.Contains(err.Error(), "node 9") {
		t.Fatalf("the error does not name the holder: %v", err)
	}
	if _, err := c.stores[2].Exists(ctx(t), k); !errors.Is(err, resp.ErrUnavailable) {
		t.Fatalf("EXISTS with only a hung and a dead holder: %v; want TRYAGAIN", err)
	}
	// A write stands locally; the holder believed up that did not answer
	// makes it TRYAGAIN, the one marked down does not.
	if err := c.stores[2].Set(ctx(t), k, []byte("w")); !errors.Is(err, resp.ErrUnavailable) {
		t.Fatalf("SET with a hung holder up: %v; want TRYAGAIN", err)
	}
	mustGet(t, c.locals[2], k, "w")
	c.pin(k, respcluster.Holder{Node: 9, Up: false})
	if err := c.stores[2].Set(ctx(t), k, []byte("w2")); err != nil {
		t.Fatalf("SET with only a holder marked down: %v", err)
	}
}

// A node without the Keyspace service (an older version) holds nothing
// it can share: its keys read as a miss elsewhere, as they did.
func TestANodeWithoutTheServiceReadsAsAMiss(t *testing.T) {
	c := newCluster(t, 2)
	c.serve(7, grpc.NewServer())
	k := c.key("prompt:1")
	c.pin(k, respcluster.Holder{Node: 7, Up: true})
	mustMiss(t, c.stores[1], k)
}

func TestInfoCountsRequestsToOtherNodes(t *testing.T) {
	c := newCluster(t, 2)
	k := c.key("prompt:1")
	if err := c.stores[1].Set(ctx(t), k, []byte("v")); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[2], k, "v")
	fields := map[string]string{}
	for _, f := range c.stores[2].Info(ctx(t)) {
		if f.Section == "cluster" {
			fields[f.Name] = f.Value
		}
	}
	if fields["keyspace_remote_gets"] != "1" || fields["keyspace_remote_hits"] != "1" {
		t.Fatalf("INFO cluster = %v", fields)
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	c := newCluster(t, 1)
	_, err := respcluster.New(resptest.NewMemStore(), directory{c, 1}, c.peers, &respcluster.Config{PeerTimeout: -time.Second})
	if !errors.Is(err, respcluster.ErrBadConfig) || !strings.Contains(err.Error(), "PeerTimeout") {
		t.Fatalf("New with a negative PeerTimeout: %v", err)
	}
	if _, err := respcluster.New(nil, directory{c, 1}, c.peers, nil); !errors.Is(err, respcluster.ErrBadConfig) {
		t.Fatalf("New without a local store: %v", err)
	}
}

// BenchmarkGet compares a GET the node answers itself with one it fetches
// from another node over loopback gRPC.
func BenchmarkGet(b *testing.B) {
	for _, size := range []int{100, 64 << 10, 1 << 20} {
		for _, where := range []string{"local", "remote"} {
			b.Run(fmt.Sprintf("%s/%dB", where, size), func(b *testing.B) {
				c := newClusterTimeout(b, 2, 20*time.Second)
				k := c.key("prompt:1")
				if err := c.stores[1].Set(context.Background(), k, make([]byte, size)); err != nil {
					b.Fatal(err)
				}
				s := c.stores[1]
				if where == "remote" {
					s = c.stores[2]
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					_, release, err := s.View(context.Background(), k)
					if err != nil {
						b.Fatal(err)
					}
					release()
				}
			})
		}
	}
}

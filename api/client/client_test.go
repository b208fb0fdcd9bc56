package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// startNode serves a node with a 16 MiB DRAM tier over an 8 MiB second
// arena (labelled SSD) over gRPC and the TCP data plane on loopback, with a
// 1 MiB block limit and batches of at most 8 blocks.
func startNode(t *testing.T) (addr string, n *node.Node) {
	t.Helper()
	srv := nodetest.Start(t, nodetest.Options{Limits: node.Config{MaxBlockSize: 1 << 20, MaxBatchBlocks: 8, MaxBatchBytes: 4 << 20}})
	return srv.Addr, srv.Node
}

func dial(t *testing.T, addr string, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// chain makes n blocks of one chain, block i of size sizes[i%len(sizes)].
func chain(n int, sizes ...int) ([]index.Hash, []client.Block) {
	hashes := make([]index.Hash, n)
	data := make([][]byte, n)
	for i := range n {
		hashes[i] = index.Hash(1000 + i)
		data[i] = bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)])
		if len(data[i]) > 0 {
			data[i][0] = byte(i * 7)
		}
	}
	return hashes, client.Chain(42, hashes, data)
}

// Both paths, data plane and gRPC, must behave the same.
var paths = []struct {
	name string
	opts client.Options
}{{"data-plane", client.Options{}}, {"grpc", client.Options{NoDataPlane: true}}}

func TestPutGetRoundTripInBatches(t *testing.T) {
	addr, _ := startNode(t)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			c := dial(t, addr, p.opts)
			if want := map[string]string{"data-plane": "tcp", "grpc": "grpc"}[p.name]; c.DataPlane() != want {
				t.Fatalf("bytes travel over %s, want %s", c.DataPlane(), want)
			}
			// 20 blocks in batches of at most 8 blocks and 4 MiB; sizes
			// cross the gRPC chunk size.
			hashes, blocks := chain(20, 1<<20, 300<<10, 0, 1)
			for i := range blocks {
				blocks[i].Key.NS = index.NamespaceID(len(p.name))
			}
			if err := c.Put(context.Background(), blocks); err != nil {
				t.Fatal(err)
			}
			keys := make([]index.Key, len(hashes)+1)
			for i, b := range blocks {
				keys[i] = b.Key
			}
			keys[len(hashes)] = index.Key{NS: 9, Hash: 9} // missing
			res, err := c.Get(context.Background(), keys)
			if err != nil {
				t.Fatal(err)
			}
			for i, b := range blocks {
				if !res[i].Found || !bytes.Equal(res[i].Data, b.Data) || res[i].HasParent != (i > 0) {
					t.Fatalf("block %d: found %v, %d bytes, want %d", i, res[i].Found, len(res[i].Data), len(b.Data))
				}
			}
			if res[len(hashes)].Found {
				t.Fatal("missing block reported found")
			}
		})
	}
}

func TestGetFuncStreamsInOrderAndStopsAtMiss(t *testing.T) {
	addr, _ := startNode(t)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			c := dial(t, addr, p.opts)
			_, blocks := chain(6, 4096)
			_ = c.Put(context.Background(), append(blocks[:3:3], blocks[4:]...)) // block 3 missing
			keys := make([]index.Key, len(blocks))
			for i, b := range blocks {
				keys[i] = b.Key
			}
			var seen []string
			err := c.GetFunc(context.Background(), keys, client.GetOptions{StopAtMiss: true}, func(i int, r client.Result) error {
				seen = append(seen, fmt.Sprintf("%d:%v", i, r.Found))
				return nil
			})
			if err != nil || strings.Join(seen, " ") != "0:true 1:true 2:true 3:false" {
				t.Fatalf("prefix fetch saw %v, %v", seen, err)
			}
			stop := errors.New("enough")
			err = c.GetFunc(context.Background(), keys, client.GetOptions{}, func(i int, r client.Result) error { return stop })
			if !errors.Is(err, stop) {
				t.Fatalf("callback error not returned: %v", err)
			}
		})
	}
}

func TestErrorsAreTypedAndSayWhy(t *testing.T) {
	addr, _ := startNode(t)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			c := dial(t, addr, p.opts)
			_, blocks := chain(1, 2<<20)
			err := c.Put(context.Background(), blocks)
			if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "block 0 is 2.0 MiB, over the node's 1.0 MiB limit") {
				t.Fatalf("oversized block: %v", err)
			}
			_, _, err = c.Pin(context.Background(), []index.Key{{NS: 1, Hash: 1}}, time.Hour)
			if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "InvalidArgument: lease of 1h0m0s outside") {
				t.Fatalf("over-long lease: %v", err)
			}
			if err := c.Release(context.Background(), 12345); !errors.Is(err, client.ErrNotFound) {
				t.Fatalf("unknown lease: %v", err)
			}
			_, err = c.Evict(context.Background(), &pb.EvictRequest{})
			if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "no selector") {
				t.Fatalf("empty eviction: %v", err)
			}
		})
	}
}

func TestGRPCPutRefusesAnOversizedBatchWhole(t *testing.T) {
	// A client that lies about the node's limit sends a batch the node must
	// refuse before storing anything.
	addr, n := startNode(t)
	c := dial(t, addr, client.Options{NoDataPlane: true})
	c.Info().MaxBlockSize = 8 << 20
	_, blocks := chain(4, 1000)
	blocks[3].Data = make([]byte, 5<<20)
	c.Info().MaxBatchBytes = 64 << 20
	err := c.Put(context.Background(), blocks)
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "block 3 is 5.0 MiB, over the 1.0 MiB limit") {
		t.Fatalf("got %v", err)
	}
	if hs := n.Hierarchy().Stats(); hs.Keys != 0 {
		t.Fatalf("%d blocks stored from a refused batch", hs.Keys)
	}
}

func TestLookupExistsStatsEvictPin(t *testing.T) {
	addr, _ := startNode(t)
	c := dial(t, addr, client.Options{})
	ctx := context.Background()
	hashes, blocks := chain(5, 64<<10)
	if err := c.Put(ctx, blocks[:4]); err != nil {
		t.Fatal(err)
	}
	lr, err := c.Lookup(ctx, 42, hashes)
	if err != nil || lr.Blocks != 4 || len(lr.Tiers) != 1 || lr.Tiers[0].Tier != "dram" || lr.Tiers[0].Blocks != 4 {
		t.Fatalf("lookup: %v %v", lr, err)
	}
	ex, err := c.Exists(ctx, []index.Key{blocks[0].Key, blocks[4].Key})
	if err != nil || !ex[0] || ex[1] {
		t.Fatalf("exists: %v %v", ex, err)
	}
	id, _, err := c.Pin(ctx, []index.Key{blocks[0].Key}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	er, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: 42})
	if err != nil || er.Blocks != 3 || len(er.Listed) != 3 {
		t.Fatalf("evict: %v %v", er, err)
	}
	st, err := c.Stats(ctx)
	if err != nil || st.Keys != 1 || st.Pins != 1 || len(st.Tiers) != 2 || st.Tiers[0].Policy != "lru" || st.Node.DataAddr == "" {
		t.Fatalf("stats: %v %v", st, err)
	}
	if err := c.Release(ctx, id); err != nil {
		t.Fatal(err)
	}
}

func TestUnreachableNodeIsUnavailableAfterRetries(t *testing.T) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_, err := client.Dial(ctx, addr, client.Options{MaxRetries: 2, Backoff: 20 * time.Millisecond})
	if !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatal("no backoff between retries")
	}
}

func TestFullNodeIsErrFullOverBothPaths(t *testing.T) {
	addr, n := startNode(t)
	for _, p := range paths {
		// Pin every block before it lands: once the 24 MiB of tiers hold
		// only pinned blocks, the next put finds no room.
		c := dial(t, addr, p.opts)
		_, blocks := chain(40, 1<<20)
		keys := make([]index.Key, len(blocks))
		for i := range blocks {
			blocks[i].Key.NS = index.NamespaceID(100 + len(p.name))
			keys[i] = blocks[i].Key
		}
		lease, err := n.Hierarchy().Pin(keys, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var full error
		for i := range blocks {
			if full = c.Put(context.Background(), blocks[i:i+1]); full != nil {
				break
			}
		}
		var be *client.BatchError
		if !errors.Is(full, client.ErrFull) || !errors.As(full, &be) || !strings.Contains(full.Error(), "no room") {
			t.Fatalf("%s: put into a node full of pinned blocks: %v", p.name, full)
		}
		lease.Release()
		_, _ = n.Evict(node.Selector{All: true})
	}
}

func TestGetReadsIntoTheCallersBuffer(t *testing.T) {
	addr, _ := startNode(t)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			c := dial(t, addr, p.opts)
			_, blocks := chain(3, 100<<10)
			for i := range blocks {
				blocks[i].Key.NS = index.NamespaceID(200 + len(p.name))
			}
			if err := c.Put(context.Background(), blocks); err != nil {
				t.Fatal(err)
			}
			keys := []index.Key{blocks[0].Key, blocks[1].Key, blocks[2].Key}
			mine := make([]byte, 1<<20)
			err := c.GetFunc(context.Background(), keys, client.GetOptions{Buffer: func(i, size int) []byte { return mine[:size] }},
				func(i int, r client.Result) error {
					if &r.Data[0] != &mine[0] || !bytes.Equal(r.Data, blocks[i].Data) {
						t.Errorf("block %d not read into the caller's buffer", i)
					}
					return nil
				})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

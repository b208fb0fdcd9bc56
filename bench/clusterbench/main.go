// Command clusterbench measures the block directory of a running kvstrata
// cluster through its nodes' public API. bench/cluster.sh starts a 3-node
// loopback cluster and runs it; see there.
//
// It measures, one after the other:
//
//	(a) directory events driven by block puts: --concurrency workers on
//	    every node put batches of --batch new blocks of --size bytes for
//	    --duration; each put is one stored event. Events committed a second
//	    is the blocks put divided by the time until the last node's Sync
//	    returned. Meanwhile each node's Sync is timed every 20ms (commit
//	    latency as a client sees it: queueing, batching, forwarding to the
//	    leader, raft, one gRPC round trip), and a probe puts one block on a
//	    follower every 50ms and times until a lookup on another node finds
//	    it (visibility, polled every 200µs);
//	(b) lookups of a 256-block chain on a follower over gRPC: --chains
//	    chains are put on the leader, and once the follower lists them,
//	    random chains are looked up by 1 and then by 8 clients for
//	    --duration each.
//
// Block bytes must fit the nodes' DRAM: the put phase stops early at
// --max-bytes a node so that nothing is evicted (an eviction would be an
// event too, and uncounted).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

func main() {
	addrs := flag.String("addrs", "", "gRPC addresses of the cluster's nodes, comma-separated")
	duration := flag.Duration("duration", 10*time.Second, "how long each phase runs")
	size := flag.Int("size", 4096, "block size in bytes")
	batch := flag.Int("batch", 256, "blocks a put")
	conc := flag.Int("concurrency", 2, "put workers a node")
	maxBytes := flag.Int64("max-bytes", 768<<20, "block bytes put on a node at most (keep it under its DRAM's high watermark)")
	chains := flag.Int("chains", 64, "chains of 256 blocks for the lookups")
	flag.Parse()
	if err := run(strings.Split(*addrs, ","), *duration, *size, *batch, *conc, *maxBytes, *chains); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(1)
	}
}

// node is one member, dialled.
type node struct {
	id   index.NodeID
	addr string
	c    *client.Client
}

func run(addrs []string, d time.Duration, size, batch, conc int, maxBytes int64, chains int) error {
	ctx := context.Background()
	var nodes []*node
	for _, a := range addrs {
		c, err := client.Dial(ctx, a, client.Options{})
		if err != nil {
			return err
		}
		defer c.Close()
		nodes = append(nodes, &node{id: index.NodeID(c.Info().NodeId), addr: a, c: c})
	}
	ms, err := nodes[0].c.Members(ctx)
	if err != nil {
		return err
	}
	var leader *node
	var followers []*node
	for _, n := range nodes {
		if uint32(n.id) == ms.LeaderId {
			leader = n
		} else {
			followers = append(followers, n)
		}
	}
	if leader == nil || len(followers) < 2 {
		return fmt.Errorf("want a leader and two followers among %v (leader %d)", addrs, ms.LeaderId)
	}
	fmt.Printf("cluster: %d nodes, leader node %d\n\n", len(nodes), leader.id)
	if err := putPhase(ctx, nodes, followers, d, size, batch, conc, maxBytes); err != nil {
		return err
	}
	return lookupPhase(ctx, leader, followers[0], d, size, chains)
}

// putPhase runs (a).
func putPhase(ctx context.Context, nodes, followers []*node, d time.Duration, size, batch, conc int, maxBytes int64) error {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var blocks atomic.Int64
	var failed atomic.Pointer[error]
	stop := make(chan struct{})
	var wg, samplers sync.WaitGroup
	start := time.Now()
	for ni, n := range nodes {
		budget := maxBytes / int64(size) / int64(batch) / int64(conc) // puts a worker
		for w := range conc {
			wg.Go(func() {
				bs := make([]client.Block, batch)
				for p := int64(0); p < budget && time.Since(start) < d; p++ {
					for j := range bs {
						h := uint64(w)<<40 | uint64(p)<<16 | uint64(j)
						bs[j] = client.Block{Key: index.Key{NS: index.NamespaceID(0xc1c0 + ni), Hash: index.Hash(h)}, Data: data}
					}
					if err := n.c.Put(ctx, bs); err != nil {
						failed.Store(&err)
						return
					}
					blocks.Add(int64(batch))
				}
			})
		}
	}
	// Commit latency: each node's Sync, every 20ms.
	syncLat := make([][]time.Duration, len(nodes))
	for i, n := range nodes {
		samplers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				t0 := time.Now()
				if err := n.c.Sync(ctx); err == nil {
					syncLat[i] = append(syncLat[i], time.Since(t0))
				}
			}
		})
	}
	// Visibility: a block put on one follower, looked up on the other.
	var visible []time.Duration
	samplers.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			k := index.Key{NS: 0xc1ff, Hash: index.Hash(i)}
			if err := followers[0].c.Put(ctx, []client.Block{{Key: k, Data: data}}); err != nil {
				continue
			}
			t0 := time.Now()
			for time.Since(t0) < 5*time.Second {
				r, err := followers[1].c.Lookup(ctx, k.NS, []index.Hash{k.Hash})
				if err == nil && r.Blocks == 1 {
					visible = append(visible, time.Since(t0))
					break
				}
				time.Sleep(200 * time.Microsecond)
			}
		}
	})
	wg.Wait()
	for _, n := range nodes {
		if err := n.c.Sync(ctx); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	close(stop)
	samplers.Wait()
	if err := failed.Load(); err != nil {
		return fmt.Errorf("put: %w", *err)
	}
	var evictions uint64
	for _, n := range nodes {
		st, err := n.c.Stats(ctx)
		if err != nil {
			return err
		}
		for _, t := range st.Tiers {
			evictions += t.Evictions
		}
	}
	var lat []time.Duration
	for _, l := range syncLat {
		lat = append(lat, l...)
	}
	ev := blocks.Load()
	fmt.Printf("directory events driven by puts (%d nodes × %d workers, %d blocks of %d B a put)\n", len(nodes), conc, batch, size)
	fmt.Printf("  %-34s %d events in %.2f s = %.0f events/s (%.0f MB/s of blocks)\n", "committed", ev, elapsed.Seconds(),
		float64(ev)/elapsed.Seconds(), float64(ev)*float64(size)/elapsed.Seconds()/1e6)
	fmt.Printf("  %-34s p50 %s  p99 %s  (%d samples)\n", "commit latency (Sync RPC)", ms(pct(lat, .5)), ms(pct(lat, .99)), len(lat))
	fmt.Printf("  %-34s p50 %s  p99 %s  (%d samples)\n", "put on a follower → seen on another", ms(pct(visible, .5)), ms(pct(visible, .99)), len(visible))
	if evictions > 0 {
		fmt.Printf("  warning: %d evictions (uncounted events); lower --max-bytes\n", evictions)
	}
	fmt.Println()
	return nil
}

// lookupPhase runs (b).
func lookupPhase(ctx context.Context, leader, follower *node, d time.Duration, size, chains int) error {
	const length = 256
	data := make([]byte, size)
	var hashes [][]index.Hash
	for c := range chains {
		bs := make([]client.Block, length)
		chain := make([]index.Hash, length)
		for j := range bs {
			chain[j] = index.Hash(uint64(c)<<32 | uint64(j))
			bs[j] = client.Block{Key: index.Key{NS: 0xc100, Hash: chain[j]}, Data: data}
		}
		if err := leader.c.Put(ctx, bs); err != nil {
			return err
		}
		hashes = append(hashes, chain)
	}
	if err := leader.c.Sync(ctx); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := follower.c.Lookup(ctx, 0xc100, hashes[chains-1])
		if err == nil && r.Blocks == length {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("follower %d does not list the chains after 30s", follower.id)
		}
	}
	fmt.Printf("lookup of a %d-block chain on follower node %d over gRPC (%d chains on the leader)\n", length, follower.id, chains)
	for _, conc := range []int{1, 8} {
		lats := make([][]time.Duration, conc)
		var wg sync.WaitGroup
		var bad atomic.Int64
		start := time.Now()
		for w := range conc {
			wg.Go(func() {
				for time.Since(start) < d {
					chain := hashes[rand.IntN(chains)]
					t0 := time.Now()
					r, err := follower.c.Lookup(ctx, 0xc100, chain)
					lats[w] = append(lats[w], time.Since(t0))
					if err != nil || r.Blocks != length {
						bad.Add(1)
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		var lat []time.Duration
		for _, l := range lats {
			lat = append(lat, l...)
		}
		fmt.Printf("  %-34s %.0f lookups/s  p50 %s  p99 %s  (%d failed or short)\n", fmt.Sprintf("%d client(s)", conc),
			float64(len(lat))/elapsed.Seconds(), ms(pct(lat, .5)), ms(pct(lat, .99)), bad.Load())
	}
	return nil
}

// pct returns the q-th quantile of ds (which it sorts).
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(int(float64(len(ds))*q), len(ds)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", d.Seconds()*1e3) }

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// The harness of the cluster tests (cluster_e2e_test.go): clusters of real
// kvstrata processes that bootstrap together, and what the tests ask them.

// nodeHost says where a node of a cluster runs: the address it listens on
// ("" for loopback with free ports) and the command prefix that puts it
// there.
type nodeHost struct {
	ip     string
	prefix []string
}

// loopback is where the nodes of a cluster on this host's loopback run.
func loopback(n int) []nodeHost { return make([]nodeHost, n) }

// The ports of a node with an address of its own.
const (
	portGRPC = 7070 + iota
	portData
	portRaft
	portRESP
	portHTTP
)

// startCluster starts one node per host, node i+1 on hosts[i], that
// bootstrap a cluster together (the same --cluster-bootstrap list for
// all), waits until every one is ready and they agree on a leader, and
// returns them by node id - 1.
func startCluster(t *testing.T, hosts []nodeHost, extra ...string) []*proc {
	t.Helper()
	return startClusterWith(t, hosts, nil, extra...)
}

// startClusterWith is startCluster with prep called on each node before
// it starts (node i+1 is procs[i]), to add what only that node takes.
func startClusterWith(t *testing.T, hosts []nodeHost, prep func(i int, p *proc), extra ...string) []*proc {
	t.Helper()
	addr := func(h nodeHost, port int) string {
		if h.ip == "" {
			return freeport.Addr(t)
		}
		return net.JoinHostPort(h.ip, strconv.Itoa(port))
	}
	procs := make([]*proc, len(hosts))
	var peers []string
	for i, h := range hosts {
		p := &proc{t: t, dir: t.TempDir(), prefix: h.prefix, grpc: addr(h, portGRPC), resp: addr(h, portRESP), http: addr(h, portHTTP)}
		raft := addr(h, portRaft)
		p.args = append([]string{"serve", "--node-id", strconv.Itoa(i + 1), "--data-dir", p.dir,
			"--dram-capacity", "64MiB", "--ssd-capacity", "512MiB", "--listen-grpc", p.grpc, "--listen-data", addr(h, portData),
			"--listen-resp", p.resp, "--listen-http", p.http, "--cluster-raft-addr", raft}, extra...)
		if h.ip != "" {
			// A node in a network namespace listens on an address of its
			// own, reachable only from the test's namespaces.
			p.args = append(p.args, "--insecure-allow-remote")
		}
		peers = append(peers, fmt.Sprintf("%d=%s", i+1, raft))
		procs[i] = p
	}
	for i, p := range procs {
		p.args = append(p.args, "--cluster-bootstrap", strings.Join(peers, ","))
		if prep != nil {
			prep(i, p)
		}
		p.launch()
	}
	for _, p := range procs {
		p.waitReady()
	}
	leaderOf(t, procs...)
	return procs
}

// members returns Members as node c answers it.
func members(t *testing.T, c *client.Client) *pb.MembersResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Members(ctx)
	if err != nil {
		t.Fatalf("members: %v", err)
	}
	return resp
}

// leaderOf waits until the nodes agree on a leader and returns its id.
func leaderOf(t *testing.T, nodes ...*proc) index.NodeID {
	t.Helper()
	var leader uint32
	eventually(t, 20*time.Second, "the nodes agree on a leader", func() bool {
		leader = 0
		for _, p := range nodes {
			id := members(t, p.api()).LeaderId
			if id == 0 || leader != 0 && id != leader {
				return false
			}
			leader = id
		}
		return true
	})
	return index.NodeID(leader)
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// waitDigestsEqual waits until every node's directory has the same digest
// (nothing diverged) and returns the key count.
func waitDigestsEqual(t *testing.T, nodes ...*proc) uint64 {
	t.Helper()
	var keys []uint64
	var digests []uint64
	eventually(t, 15*time.Second, "the directories of every replica converge", func() bool {
		keys, digests = nil, nil
		for _, p := range nodes {
			r := members(t, p.api())
			keys, digests = append(keys, r.DirectoryKeys), append(digests, r.DirectoryDigest)
		}
		return !slices.ContainsFunc(digests, func(d uint64) bool { return d != digests[0] })
	})
	return keys[0]
}

// locatedAt reports, per key, whether Locate on c lists it at node.
func locatedAt(t *testing.T, c *client.Client, keys []index.Key, node index.NodeID) []bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kls, err := c.Locate(ctx, keys)
	if err != nil {
		t.Fatalf("locate: %v", err)
	}
	out := make([]bool, len(keys))
	for i, kl := range kls {
		out[i] = slices.ContainsFunc(kl.Locations, func(l *pb.TierBlocks) bool { return index.NodeID(l.NodeId) == node })
	}
	return out
}

// allLocatedAt reports whether Locate on c lists every key at node.
func allLocatedAt(t *testing.T, c *client.Client, keys []index.Key, node index.NodeID) bool {
	return !slices.Contains(locatedAt(t, c, keys, node), false)
}

// noneLocatedAt reports whether Locate on c lists no key at node.
func noneLocatedAt(t *testing.T, c *client.Client, keys []index.Key, node index.NodeID) bool {
	return !slices.Contains(locatedAt(t, c, keys, node), true)
}

// lookupAt returns how many leading blocks of chain a lookup on c finds at
// node.
func lookupAt(t *testing.T, c *client.Client, ns index.NamespaceID, chain []index.Hash, node index.NodeID) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Lookup(ctx, ns, chain)
	if err != nil {
		t.Fatalf("lookup: %v", err)
	}
	var n uint32
	for _, tb := range r.Tiers {
		if index.NodeID(tb.NodeId) == node {
			n = max(n, tb.Blocks)
		}
	}
	return n
}

// syncNode waits (up to timeout) until every directory event node c made
// so far is committed.
func syncNode(c *client.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Sync(ctx)
}

// hashesOf returns the hashes of keys.
func hashesOf(keys []index.Key) []index.Hash {
	out := make([]index.Hash, len(keys))
	for i, k := range keys {
		out[i] = k.Hash
	}
	return out
}

// fetchedIntact fetches keys through a cluster client seeded at p and
// returns how many came back, failing on wrong bytes.
func fetchedIntact(t *testing.T, p *proc, keys []index.Key, size int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := client.NewClusterClient(p.api(), client.Options{})
	defer cl.Close()
	res, err := cl.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, r := range res {
		if r.Found {
			if !bytes.Equal(r.Data, blockData(int(keys[i].Hash), size)) {
				t.Fatalf("block %v came back corrupt", keys[i])
			}
			n++
		}
	}
	return n
}

// memberOf returns member id of resp, or nil.
func memberOf(resp *pb.MembersResponse, id index.NodeID) *pb.Member {
	for _, m := range resp.Members {
		if index.NodeID(m.Id) == id {
			return m
		}
	}
	return nil
}

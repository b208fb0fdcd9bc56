package membership_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvstrata/kvstrata/api/membership"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/raftstore"
)

// This file runs clusters of api/membership agents in one process, each with
// its raft on a real TCP transport and its Cluster service on a real gRPC
// server, all on loopback: bootstrap, forwarding to the leader, join,
// remove and liveness, as a node's wiring does them. The tests of whole
// kvstrata processes are in cmd/kvstrata.

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// The liveness settings of the test clusters: a silent node is marked down
// within about a second, with room for a slow (race-detector) scheduler.
const (
	testHeartbeat = 100 * time.Millisecond
	testLiveness  = time.Second
)

// member is one node of a test cluster; c is nil while it is stopped.
type member struct {
	id       index.NodeID
	dir      string
	raftAddr string
	grpcAddr string
	cfg      membership.Config
	c        *membership.Agent
	srv      *grpc.Server
	conn     *grpc.ClientConn
}

// testCluster is a set of members in one process.
type testCluster struct {
	t       testing.TB
	members []*member
}

// startCluster starts n members that bootstrap a cluster together, and
// waits until they agree on a leader and every one is registered.
func startCluster(t testing.TB, n int) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []raftstore.Peer
	for i := 1; i <= n; i++ {
		m := tc.newMember(index.NodeID(i))
		peers = append(peers, raftstore.Peer{ID: m.id, RaftAddr: m.raftAddr})
	}
	for _, m := range tc.members {
		tc.open(m, membership.Config{Bootstrap: peers})
	}
	tc.waitSettled()
	return tc
}

// newMember adds a member with fresh addresses, not started.
func (tc *testCluster) newMember(id index.NodeID) *member {
	m := &member{id: id, dir: tc.t.TempDir(), raftAddr: freeport.Addr(tc.t), grpcAddr: freeport.Addr(tc.t)}
	tc.members = append(tc.members, m)
	return m
}

// open starts m's cluster membership with cfg (its identity, addresses and
// the test timings are filled in) and its gRPC server; a member opened
// again keeps its directory and addresses.
func (tc *testCluster) open(m *member, cfg membership.Config) {
	t := tc.t
	t.Helper()
	cfg.ID, cfg.Dir, cfg.RaftAddr, cfg.Logger = m.id, m.dir, m.raftAddr, quiet
	cfg.HeartbeatInterval, cfg.LivenessTimeout = testHeartbeat, testLiveness
	m.cfg = cfg
	c, err := membership.Open(cfg)
	if err != nil {
		t.Fatalf("node %d: %v", m.id, err)
	}
	lis, err := net.Listen("tcp", m.grpcAddr)
	if err != nil {
		c.Close()
		t.Fatalf("node %d: %v", m.id, err)
	}
	m.c, m.srv = c, grpc.NewServer()
	c.Register(m.srv)
	go m.srv.Serve(lis)
	t.Cleanup(func() { tc.stop(m) })
	if err := c.Start(raftstore.Member{GRPCAddr: m.grpcAddr}, nil); err != nil {
		t.Fatalf("node %d: start: %v", m.id, err)
	}
}

// stop stops m as a crash would, but for the second the cluster gets to
// publish what is queued; stopping a stopped member does nothing.
func (tc *testCluster) stop(m *member) {
	if m.c == nil {
		return
	}
	m.srv.Stop()
	m.c.Close()
	m.c, m.srv = nil, nil
}

// reopen starts a stopped member again on its directory and addresses.
func (tc *testCluster) reopen(m *member) { tc.open(m, m.cfg) }

// running returns the members that are started.
func (tc *testCluster) running() []*member {
	var out []*member
	for _, m := range tc.members {
		if m.c != nil {
			out = append(out, m)
		}
	}
	return out
}

// rpc returns a Cluster service client of m.
func (tc *testCluster) rpc(m *member) pb.ClusterClient {
	tc.t.Helper()
	if m.conn == nil {
		cc, err := grpc.NewClient(m.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			tc.t.Fatal(err)
		}
		m.conn = cc
		tc.t.Cleanup(func() { cc.Close() })
	}
	return pb.NewClusterClient(m.conn)
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitSettled waits until every running member names the same leader, and
// knows every running member's gRPC address.
func (tc *testCluster) waitSettled() {
	tc.t.Helper()
	waitFor(tc.t, 20*time.Second, "the members agree on a leader and know each other", func() bool {
		run := tc.running()
		leader := run[0].c.Leader()
		for _, m := range run {
			if m.c.Leader() != leader || leader == 0 {
				return false
			}
			for _, o := range run {
				if rec, ok := m.c.FSM().Member(o.id); !ok || rec.GRPCAddr != o.grpcAddr {
					return false
				}
			}
		}
		return true
	})
}

// leader returns the running member that leads.
func (tc *testCluster) leader() *member {
	tc.t.Helper()
	tc.waitSettled()
	id := tc.running()[0].c.Leader()
	for _, m := range tc.running() {
		if m.id == id {
			return m
		}
	}
	tc.t.Fatalf("the leader, node %d, is not running", id)
	return nil
}

// follower returns a running member that does not lead.
func (tc *testCluster) follower() *member {
	tc.t.Helper()
	l := tc.leader()
	for _, m := range tc.running() {
		if m != l {
			return m
		}
	}
	tc.t.Fatal("no follower runs")
	return nil
}

const testNS = index.NamespaceID(0x6b7673747261)

// chainEvents returns the stored events of the blocks from..to-1 of a chain
// at loc, and the chain's hashes.
func chainEvents(loc index.Location, from, to int) ([]index.Change, []index.Hash) {
	var evs []index.Change
	var hashes []index.Hash
	for i := from; i < to; i++ {
		h := index.Hash(uint64(loc.Node)<<40 | uint64(i))
		meta := index.Meta{Size: 64 << 10}
		if i > from {
			meta.Parent, meta.HasParent = hashes[len(hashes)-1], true
		}
		evs = append(evs, index.Change{Kind: index.ChangeStored, Key: index.Key{NS: testNS, Hash: h}, Meta: meta, Loc: loc})
		hashes = append(hashes, h)
	}
	return evs, hashes
}

// publishChain publishes a chain of n blocks in m's DRAM, syncs, and
// returns the chain.
func publishChain(t testing.TB, m *member, n int) []index.Hash {
	t.Helper()
	evs, chain := chainEvents(index.Location{Node: m.id, Tier: index.TierDRAM}, 0, n)
	for _, ev := range evs {
		m.c.Publish(ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.c.Sync(ctx); err != nil {
		t.Fatalf("node %d: sync: %v", m.id, err)
	}
	return chain
}

// waitListed waits until every member in ms finds n leading blocks of chain
// at node's DRAM (n = 0: finds none).
func waitListed(t testing.TB, ms []*member, chain []index.Hash, node index.NodeID, n int) {
	t.Helper()
	loc := index.Location{Node: node, Tier: index.TierDRAM}
	for _, m := range ms {
		waitFor(t, 5*time.Second, "a replica lists the chain as expected", func() bool {
			return m.c.Lookup(testNS, chain).At(loc) == n
		})
	}
}

// locatedAt reports whether Locate on m lists key at node.
func (tc *testCluster) locatedAt(m *member, h index.Hash, node index.NodeID) bool {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := tc.rpc(m).Locate(ctx, &pb.LocateRequest{Keys: []*pb.BlockKey{{Namespace: uint64(testNS), Hash: uint64(h)}}})
	if err != nil {
		tc.t.Fatalf("locate on node %d: %v", m.id, err)
	}
	return slices.ContainsFunc(resp.Keys[0].Locations, func(l *pb.TierBlocks) bool { return index.NodeID(l.NodeId) == node })
}

// membersOn returns Members as m answers it.
func (tc *testCluster) membersOn(m *member) *pb.MembersResponse {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := tc.rpc(m).Members(ctx, &pb.MembersRequest{})
	if err != nil {
		tc.t.Fatalf("members on node %d: %v", m.id, err)
	}
	return resp
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

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// What a client sends to the Cluster service cannot stop a node or a
// cluster: an entry that does not decode never reaches the raft log, and
// a member that cannot be reached joins without counting in the quorum.

// clusterRPC returns a plain gRPC client of p's Cluster service, as any
// program (grpcurl, say) would have.
func clusterRPC(t *testing.T, p *proc) pb.ClusterClient {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewClusterClient(cc)
}

// running fails the test if p has exited.
func running(t *testing.T, p *proc) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("kvstrata exited: %v\n%s", err, p.log)
	default:
	}
}

// commits puts n blocks in namespace ns on p, syncs them, and waits until
// a lookup on every node finds them at p's node.
func commits(t *testing.T, p *proc, node index.NodeID, ns index.NamespaceID, n int, all ...*proc) {
	t.Helper()
	keys := putBlocks(t, p.api(), ns, 0, n, 4<<10)
	if err := syncNode(p.api(), 15*time.Second); err != nil {
		t.Fatalf("node %d: sync: %v", node, err)
	}
	for _, o := range all {
		eventually(t, 10*time.Second, "every node finds the blocks", func() bool {
			return lookupAt(t, o.api(), ns, hashesOf(keys), node) == uint32(n)
		})
	}
}

func TestGarbageProposedToTheLeaderIsRefusedAndStopsNoNode(t *testing.T) {
	nodes := startCluster(t, loopback(3))
	leader := leaderOf(t, nodes...)
	rpc := clusterRPC(t, nodes[leader-1])
	for _, entry := range [][]byte{[]byte("\x01garbage"), []byte("garbage"), {0x02, 0x00}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := rpc.Propose(ctx, &pb.ProposeRequest{Entry: entry})
		cancel()
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Propose(%q) to the leader: %v, want InvalidArgument", entry, err)
		}
	}
	// Every node is up and commits: through the leader, and forwarded.
	for i, p := range nodes {
		running(t, p)
		commits(t, p, index.NodeID(i+1), index.NamespaceID(40+i), 16, nodes...)
	}
	if got := leaderOf(t, nodes...); got != leader {
		t.Logf("leadership moved from node %d to node %d", leader, got)
	}
	for _, p := range nodes {
		running(t, p)
	}
}

func TestJoinOfAnUnreachableMemberLeavesALoneNodeLeading(t *testing.T) {
	p := startNode(t, t.TempDir(), "--node-id", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := clusterRPC(t, p).Join(ctx, &pb.JoinRequest{Member: &pb.Member{Id: 99, RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:2"}})
	if err != nil {
		t.Fatalf("join of an unreachable member: %v", err)
	}
	for round := range 2 { // and again after a restart
		leaderOf(t, p)
		commits(t, p, 1, index.NamespaceID(50+round), 8, p)
		r := members(t, p.api())
		for _, m := range r.Members {
			if m.Id == 99 && m.Voter {
				t.Fatalf("the unreachable member is a voter: %v", m)
			}
		}
		p.stop()
		p.restart()
	}
}

func TestANodeThatJoinsBecomesAVoterAndCommits(t *testing.T) {
	first := startNode(t, t.TempDir(), "--node-id", "1")
	second := startNode(t, t.TempDir(), "--node-id", "2", "--cluster-join", first.grpc)
	eventually(t, 20*time.Second, "the leader lists node 2 as a voter", func() bool {
		for _, m := range members(t, first.api()).Members {
			if m.Id == 2 {
				return m.Voter
			}
		}
		return false
	})
	leaderOf(t, first, second)
	commits(t, second, 2, 60, 8, first, second)
}

// TestANodeWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries puts an
// entry of an unknown type into a stopped node's raft log, as a build that
// did not validate proposals let {"entry":"Z2FyYmFnZQ=="} in: the node
// stops on it, saying how to go on, and --cluster-skip-entries brings it
// back.
func TestANodeWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries(t *testing.T) {
	p := startNode(t, t.TempDir())
	p.stop()
	idx := appendUnchecked(t, filepath.Join(p.dir, "raft", "log"), []byte("garbage"))

	p.launch()
	hint := fmt.Sprintf("restart every node with --cluster-skip-entries %d", idx)
	select {
	case err := <-p.exited:
		if err == nil || !strings.Contains(p.log.String(), hint) {
			t.Fatalf("kvstrata exited with %v, without saying %q:\n%s", err, hint, p.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("kvstrata still runs 30s after its start over an unknown entry:\n%s", p.log)
	}

	p.args = append(p.args, "--cluster-skip-entries", fmt.Sprint(idx))
	p.start()
	commits(t, p, 1, 7, 10, p)
	if !strings.Contains(p.log.String(), "skipped an entry of an unknown type") {
		t.Errorf("the node did not log the skipped entry:\n%s", p.log)
	}
	p.stop()
	p.start() // and over the entry again
	commits(t, p, 1, 8, 10, p)
}

// appendUnchecked appends a command entry with data to the closed raft log
// store in dir, in the term of its last entry, as a leader that took it
// without checking it did, and returns its index.
func appendUnchecked(t *testing.T, dir string, data []byte) uint64 {
	t.Helper()
	store, err := raftstore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	last, err := store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	var prev raft.Log
	if err := store.GetLog(last, &prev); err != nil {
		t.Fatal(err)
	}
	if err := store.StoreLog(&raft.Log{Index: last + 1, Term: prev.Term, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return last + 1
}

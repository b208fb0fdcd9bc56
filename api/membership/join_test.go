package membership_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// A made-up member: nothing listens at its addresses.
var unreachable = &pb.Member{Id: 99, RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:2"}

// TestJoinOfAnUnreachableNodeLeavesALeaderThatCommits: a node that
// cannot be reached joins as a non-voter and is never promoted, so the
// cluster keeps its quorum and its leader, across restarts too; a lone
// node stays a leader.
func TestJoinOfAnUnreachableNodeLeavesALeaderThatCommits(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", n), func(t *testing.T) {
			tc := startCluster(t, n)
			asked := tc.running()[n-1]
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if _, err := tc.rpc(asked).Join(ctx, &pb.JoinRequest{Member: unreachable}); err != nil {
				t.Fatalf("join of node 99 through node %d: %v", asked.id, err)
			}
			// The monitor marks it down after the liveness timeout: it
			// has run, and tried to promote it, many times by then.
			waitFor(t, testLiveness+10*time.Second, "node 99 is marked down", func() bool {
				m := memberOf(tc.membersOn(tc.leader()), 99)
				return m != nil && !m.Up
			})
			check := func() {
				t.Helper()
				l := tc.leader()
				if m := memberOf(tc.membersOn(l), 99); m == nil || m.Voter {
					t.Fatalf("the leader lists node 99 as %v, want a non-voter", m)
				}
				chain := publishChain(t, l, 8)
				waitListed(t, tc.running(), chain, l.id, 8)
			}
			check()

			for _, m := range tc.running() {
				tc.stop(m)
			}
			for _, m := range tc.members {
				tc.reopen(m)
			}
			tc.waitSettled()
			check()
		})
	}
}

// TestJoinRefusesAnIDTakenAtAnotherAddress: a join may not move a member,
// the leader included, to another raft address.
func TestJoinRefusesAnIDTakenAtAnotherAddress(t *testing.T) {
	tc := startCluster(t, 1)
	l := tc.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := tc.rpc(l).Join(ctx, &pb.JoinRequest{Member: &pb.Member{Id: uint32(l.id), RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:2"}})
	if code(err) != "FailedPrecondition" {
		t.Fatalf("join of the leader's id at another address: %v, want FailedPrecondition", err)
	}
	chain := publishChain(t, l, 4)
	waitListed(t, tc.running(), chain, l.id, 4)
}

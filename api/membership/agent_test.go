package membership_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/membership"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// The behaviour of cluster members in one process over real loopback
// sockets; testcluster_test.go has the harness.

func TestEventsPublishedOnAFollowerAreListedOnEveryReplica(t *testing.T) {
	tc := startCluster(t, 3)
	f := tc.follower()
	chain := publishChain(t, f, 64) // forwarded to the leader
	waitListed(t, tc.running(), chain, f.id, 64)
	for _, m := range tc.running() {
		if !tc.locatedAt(m, chain[63], f.id) {
			t.Errorf("Locate on node %d does not list node %d for the chain's last block", m.id, f.id)
		}
	}
}

func TestANodesBlocksAreNeverListedBeforeItsAddress(t *testing.T) {
	tc := startCluster(t, 3)
	m := tc.follower()
	tc.stop(m)
	m.grpcAddr = freeport.Addr(t) // it comes back somewhere else
	tc.reopen(m)
	publishChain(t, m, 4) // before its first liveness tick
	var l *member
	for _, o := range tc.running() {
		if o.id == m.c.Leader() {
			l = o
		}
	}
	if rec, ok := l.c.FSM().Member(m.id); !ok || rec.GRPCAddr != m.grpcAddr {
		t.Fatalf("the leader applied node %d's events with its member record %+v, want the address %s", m.id, rec, m.grpcAddr)
	}
}

func TestJoinThroughAFollowerAddsAVoterThatCatchesUp(t *testing.T) {
	tc := startCluster(t, 3)
	f := tc.follower()
	before := publishChain(t, tc.leader(), 32)

	n4 := tc.newMember(4)
	tc.open(n4, membership.Config{Join: f.grpcAddr}) // Start returns once joined
	tc.waitSettled()
	// It joined as a non-voter; the leader promotes it once it caught up.
	waitFor(t, 10*time.Second, "the leader lists node 4 as a voter", func() bool {
		m := memberOf(tc.membersOn(tc.leader()), 4)
		return m != nil && m.Voter && m.GrpcAddr == n4.grpcAddr
	})
	waitListed(t, []*member{n4}, before, tc.leader().id, 32) // what was committed before it joined

	mine := publishChain(t, n4, 16)
	waitListed(t, tc.running(), mine, 4, 16)
}

func TestRemoveThroughAFollowerTakesTheNodeAndItsBlocksOut(t *testing.T) {
	tc := startCluster(t, 3)
	gone := tc.follower()
	chain := publishChain(t, gone, 16)
	waitListed(t, tc.running(), chain, gone.id, 16)
	tc.stop(gone)

	// Ask a survivor that does not lead, if there is one after the stop.
	var asked *member
	for _, m := range tc.running() {
		if asked == nil || m != tc.leader() {
			asked = m
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := tc.rpc(asked).Remove(ctx, &pb.RemoveRequest{Id: uint32(gone.id)}); err != nil {
		t.Fatalf("remove node %d through node %d: %v", gone.id, asked.id, err)
	}
	waitListed(t, tc.running(), chain, gone.id, 0)
	for _, m := range tc.running() {
		waitFor(t, 5*time.Second, "the member is forgotten on every replica", func() bool {
			_, ok := m.c.FSM().Member(gone.id)
			return !ok
		})
		if got := memberOf(tc.membersOn(m), gone.id); got != nil {
			t.Errorf("node %d still lists node %d: %v", m.id, gone.id, got)
		}
	}
	// Two voters of two: the cluster still commits.
	after := publishChain(t, tc.follower(), 8)
	waitListed(t, tc.running(), after, tc.follower().id, 8)
}

func TestANodeRemovedWhileRunningCannotPutItsBlocksBack(t *testing.T) {
	tc := startCluster(t, 3)
	gone, l := tc.follower(), tc.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if _, err := tc.rpc(l).Remove(ctx, &pb.RemoveRequest{Id: uint32(gone.id)}); err != nil {
		t.Fatal(err)
	}
	// The removed node still runs, stores blocks and publishes them, and
	// for a while still knows the leader.
	evs, chain := chainEvents(index.Location{Node: gone.id, Tier: index.TierDRAM}, 0, 4)
	for _, ev := range evs {
		gone.c.Publish(ev)
	}
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	if err := gone.c.Sync(sctx); err == nil {
		t.Error("a removed node's events were committed")
	}
	for _, m := range tc.running() {
		if m == gone {
			continue
		}
		if n := m.c.Lookup(testNS, chain).Blocks; n != 0 {
			t.Errorf("node %d lists %d blocks of the removed node", m.id, n)
		}
		if _, ok := m.c.FSM().Member(gone.id); ok {
			t.Errorf("node %d lists the removed node as a member again", m.id)
		}
	}
}

func TestSilentNodeIsMarkedDownAndLocateSkipsItUntilItIsBack(t *testing.T) {
	tc := startCluster(t, 3)
	quiet := tc.follower()
	chain := publishChain(t, quiet, 8)
	waitListed(t, tc.running(), chain, quiet.id, 8)
	tc.stop(quiet)
	survivors := tc.running()

	stopped := time.Now()
	for _, m := range survivors {
		waitFor(t, testLiveness+5*time.Second, "the silent node is marked down on every survivor", func() bool {
			r := memberOf(tc.membersOn(m), quiet.id)
			return r != nil && !r.Up
		})
	}
	t.Logf("node %d marked down %v after it stopped (liveness timeout %v)", quiet.id, time.Since(stopped).Round(time.Millisecond), testLiveness)
	for _, m := range survivors {
		if n := m.c.Lookup(testNS, chain).At(index.Location{Node: quiet.id, Tier: index.TierDRAM}); n != 0 {
			t.Errorf("a lookup on node %d counts %d blocks on the down node", m.id, n)
		}
		if tc.locatedAt(m, chain[0], quiet.id) {
			t.Errorf("Locate on node %d lists the down node", m.id)
		}
		if _, ok := m.c.FSM().Directory().Get(index.Key{NS: testNS, Hash: chain[0]}); !ok {
			t.Errorf("node %d forgot the down node's blocks; they should only stop counting", m.id)
		}
	}

	tc.reopen(quiet)
	for _, m := range tc.running() {
		waitFor(t, 10*time.Second, "the node is marked up again", func() bool {
			r := memberOf(tc.membersOn(m), quiet.id)
			return r != nil && r.Up
		})
	}
	waitListed(t, tc.running(), chain, quiet.id, 8)
	if !tc.locatedAt(tc.leader(), chain[0], quiet.id) {
		t.Error("Locate does not list the node back up")
	}
}

func TestSyncWaitsForAQuorum(t *testing.T) {
	tc := startCluster(t, 3)
	l := tc.leader()
	var last *member
	for _, m := range tc.running() {
		if m != l {
			tc.stop(m)
			last = m
		}
	}
	evs, chain := chainEvents(index.Location{Node: l.id, Tier: index.TierDRAM}, 0, 8)
	for _, ev := range evs {
		l.c.Publish(ev)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := l.c.Sync(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("sync with one node of three: %v, want a deadline error", err)
	}
	if n := l.c.Lookup(testNS, chain).Blocks; n != 0 {
		t.Fatalf("%d blocks listed without a quorum", n)
	}

	tc.reopen(last)
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := tc.running()[0].c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// The lone node's events were queued, not lost.
	waitListed(t, tc.running(), chain, l.id, 8)
}

// A node's own writes are visible to lookups on it once Sync returns, on
// a follower too, whose replica applies the leader's commits a moment
// after the leader.
func TestSyncMakesANodesOwnEventsVisibleOnItsReplica(t *testing.T) {
	tc := startCluster(t, 3)
	f := tc.follower()
	for round := range 20 {
		evs, chain := chainEvents(index.Location{Node: f.id, Tier: index.TierDRAM}, round*16, round*16+16)
		for _, ev := range evs {
			f.c.Publish(ev)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := f.c.Sync(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if n := f.c.Lookup(testNS, chain).Blocks; n != 16 {
			t.Fatalf("round %d: right after Sync the follower lists %d of the 16 blocks it published", round, n)
		}
	}
}

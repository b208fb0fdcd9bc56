package membership_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/membership"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// Liveness, forwarding and readiness across leader changes.

// electionTimeout is raft's default, which the test clusters use.
const electionTimeout = time.Second

// A leader that was deposed while it could not hear anyone (paused, cut
// off) may wake up with old observations and decide that healthy nodes
// are down. Its decision must change nothing: it is neither forwarded to
// the new leader nor applied in a later term.
func TestADeposedLeadersLivenessDecisionChangesNothing(t *testing.T) {
	tc := startCluster(t, 3)
	old := tc.leader()
	healthy := tc.follower()
	tc.stop(old)
	waitFor(t, 20*time.Second, "the survivors elect another leader", func() bool {
		id := healthy.c.Leader()
		return id != 0 && id != old.id
	})
	now := tc.leader()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, entry := range map[string][]byte{
		// What the old monitor forwarded, and what it would decide now,
		// in the term it led (at most the new leader's term minus one).
		"liveness":         raftstore.EncodeLiveness(healthy.id, false, time.Now()),
		"liveness-in-term": raftstore.EncodeLivenessInTerm(1, healthy.id, false, time.Now()),
	} {
		_, err := tc.rpc(now).Propose(ctx, &pb.ProposeRequest{Entry: entry})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("the new leader took a forwarded %s entry: %v, want PermissionDenied", name, err)
		}
	}
	// Nor is a decision of an earlier term applied when it is appended in
	// a later one (raftstore's FSM tests apply such entries directly).
	for _, m := range tc.running() {
		if r := memberOf(tc.membersOn(m), healthy.id); r == nil || !r.Up {
			t.Errorf("node %d lists the healthy node %d as %v", m.id, healthy.id, r)
		}
	}
}

// A follower's publishing follows a new leader at once: a batch published
// right after the leader stops answering is committed once the survivors
// elect a leader, not after a forward to the old one times out. The old
// leader stops as a paused process does: its gRPC port still accepts
// connections, and never answers.
func TestAFollowersPublishFollowsANewLeader(t *testing.T) {
	tc := startCluster(t, 3)
	old := tc.leader()
	var f *member
	for _, m := range tc.running() {
		if m != old && (f == nil || m.id < f.id) {
			f = m
		}
	}
	publishChain(t, f, 4) // the forwarding path is warm
	tc.stop(old)
	mute := listenMute(t, old.grpcAddr)
	stopped := time.Now()
	evs, chain := chainEvents(index.Location{Node: f.id, Tier: index.TierDRAM}, 100, 116)
	for _, ev := range evs {
		f.c.Publish(ev)
	}
	// An election takes one to two election timeouts; a third is for the
	// forward and a slow machine. A forward to the mute leader used to
	// wait out its 10 s deadline.
	bound := 3 * electionTimeout
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := f.c.Sync(ctx); err != nil {
		t.Fatalf("node %d's batch, published when the leader went mute, is not committed within %v (3 election timeouts): %v", f.id, bound, err)
	}
	t.Logf("node %d's batch committed %v after the leader went mute (%d connections to it); node %d leads now",
		f.id, time.Since(stopped).Round(time.Millisecond), mute.Load(), f.c.Leader())
	waitListed(t, tc.running(), chain, f.id, 16)
}

// listenMute listens on addr, accepts connections and never answers, as
// the kernel does for a paused process; it returns the count of
// connections accepted.
func listenMute(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return &n
}

// A node that knows no leader is not ready, says why, and its lookups say
// they are not current; once a leader is back it is ready again.
func TestANodeWithoutALeaderIsNotReady(t *testing.T) {
	tc := startCluster(t, 3)
	last := tc.follower()
	waitFor(t, 10*time.Second, "a settled member is ready", func() bool { return last.c.Ready() == nil })
	var stopped []*member
	for _, m := range tc.running() {
		if m != last {
			tc.stop(m)
			stopped = append(stopped, m)
		}
	}
	waitFor(t, 10*time.Second, "the lone member loses its leader", func() bool { return last.c.Leader() == 0 })
	if err := last.c.Ready(); !errors.Is(err, membership.ErrNoLeader) {
		t.Errorf("Ready without a leader: %v, want ErrNoLeader", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := tc.rpc(last).Locate(ctx, &pb.LocateRequest{Keys: []*pb.BlockKey{{Namespace: uint64(testNS), Hash: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if f := resp.Freshness; f == nil || f.Current || f.LeaderId != 0 || f.Reason == "" {
		t.Errorf("Locate without a leader says its answer is %v, want not current, no leader, and why", f)
	}

	tc.reopen(stopped[0])
	waitFor(t, 20*time.Second, "the member is ready again once there is a leader", func() bool { return last.c.Ready() == nil })
	if f := last.c.Freshness(); !f.Current() || f.Leader == 0 || f.AppliedIndex == 0 {
		t.Errorf("a ready member's freshness: %+v", f)
	}
}

// A cluster of one is ready as soon as it elected itself: the first
// command of the README.
func TestALoneNodeIsReady(t *testing.T) {
	tc := startCluster(t, 1)
	waitFor(t, 10*time.Second, "a cluster of one is ready", func() bool { return tc.members[0].c.Ready() == nil })
}

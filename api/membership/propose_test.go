package membership_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// code returns the gRPC code of err as a word ("OK" for nil).
func code(err error) string { return status.Code(err).String() }

// asMember returns ctx with the metadata under which member id forwards
// its proposals.
func asMember(ctx context.Context, id index.NodeID) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "kvstrata-proposer", strconv.FormatUint(uint64(id), 10))
}

// TestProposeKeepsGarbageAndStrangersEntriesOutOfTheLog: what a client
// sends to Propose is decoded and checked before the log; none of it
// stops a node, and the cluster goes on committing.
func TestProposeKeepsGarbageAndStrangersEntriesOutOfTheLog(t *testing.T) {
	tc := startCluster(t, 3)
	l, f := tc.leader(), tc.follower()
	other := index.Location{Node: l.id, Tier: index.TierDRAM}
	evs, _ := chainEvents(other, 0, 2)
	var b raftstore.EventBatch
	for _, ev := range evs {
		b.Append(ev)
	}
	cases := []struct {
		name  string
		to    *member
		from  index.NodeID // 0: no proposer named
		entry []byte
		want  string
	}{
		{"garbage to the leader", l, 0, []byte("\x01garbage"), "InvalidArgument"},
		{"garbage to a follower", f, 0, []byte("\x01garbage"), "InvalidArgument"},
		{"garbage from a member", l, f.id, []byte("\x01garbage"), "InvalidArgument"},
		{"an unknown type", l, f.id, []byte("garbage"), "InvalidArgument"},
		{"empty", l, f.id, nil, "InvalidArgument"},
		{"a valid entry from no member", l, 0, raftstore.EncodeMemberRemove(f.id), "PermissionDenied"},
		{"a removal from a member", l, f.id, raftstore.EncodeMemberRemove(l.id), "PermissionDenied"},
		{"liveness from a member", l, f.id, raftstore.EncodeLiveness(l.id, false, time.Now()), "PermissionDenied"},
		{"another node's events", l, f.id, b.Encode(), "PermissionDenied"},
		{"from a stranger", l, 42, raftstore.EncodeMemberUpsert(raftstore.Member{ID: 42, RaftAddr: "x:1", GRPCAddr: "x:2"}), "FailedPrecondition"},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if c.from != 0 {
			ctx = asMember(ctx, c.from)
		}
		_, err := tc.rpc(c.to).Propose(ctx, &pb.ProposeRequest{Entry: c.entry})
		cancel()
		if code(err) != c.want {
			t.Errorf("%s: Propose = %v, want %s", c.name, err, c.want)
		}
	}
	for _, m := range tc.running() {
		chain := publishChain(t, m, 8)
		waitListed(t, tc.running(), chain, m.id, 8)
		if st := m.c.FSM().Stats(); st.Invalid != 0 {
			t.Errorf("node %d applied %d invalid entries", m.id, st.Invalid)
		}
		if r := memberOf(tc.membersOn(m), l.id); r == nil || !r.Up {
			t.Errorf("node %d lists the leader as %v", m.id, r)
		}
	}
}

package membership_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvstrata/kvstrata/api/membership"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/raftstore"
)

func plannerPB(pool string, seq uint64, current, target int64) *pb.PlannerDecision {
	return &pb.PlannerDecision{Planner: "planner-0", Pool: pool, Seq: seq, Current: current, Target: target,
		Need: float64(target) - 0.4, Reason: "load", Mode: "active", Applied: true, AtUnixMs: 1_780_000_000_000}
}

// everyReplicaHolds waits until every running member's replica holds the
// records want (as fmt prints them).
func (tc *testCluster) everyReplicaHolds(want string) {
	tc.t.Helper()
	waitFor(tc.t, 10*time.Second, "every replica holds the planner records "+want, func() bool {
		for _, m := range tc.running() {
			if fmt.Sprint(m.c.FSM().PlannerRecords()) != want {
				return false
			}
		}
		return true
	})
}

func TestPlannerRecordsAreReplicatedAndSurviveALeaderChange(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := context.Background()
	leader, follower := tc.leader(), tc.follower()

	// Through a follower: forwarded to the leader.
	if _, err := tc.rpc(follower).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: []*pb.PlannerDecision{
		plannerPB("prefill", 1, 1, 2), plannerPB("decode", 1, 1, 3)}}); err != nil {
		t.Fatalf("PutPlannerDecisions through node %d: %v", follower.id, err)
	}
	if _, err := tc.rpc(follower).AckPlannerDecision(ctx, &pb.AckPlannerDecisionRequest{Pool: "prefill", Seq: 1, Replicas: 2}); err != nil {
		t.Fatalf("AckPlannerDecision through node %d: %v", follower.id, err)
	}
	tc.everyReplicaHolds(fmt.Sprint(leader.c.FSM().PlannerRecords()))
	resp, err := tc.rpc(follower).ListPlannerDecisions(ctx, &pb.ListPlannerDecisionsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Decisions) != 2 || resp.Decisions[0].Pool != "decode" || resp.Decisions[1].AckSeq != 1 ||
		resp.Decisions[1].AckReplicas != 2 || resp.Decisions[1].Target != 2 || resp.Decisions[1].Need != 1.6 {
		t.Fatalf("ListPlannerDecisions = %v", resp.Decisions)
	}

	// The HTTP view of a replica says the same.
	srv := httptest.NewServer(membership.PlannerHandler(follower.c))
	defer srv.Close()
	hr, err := http.Get(srv.URL + membership.PlannerDecisionsPath)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Decisions []membership.PlannerDecisionJSON
	}
	err = json.NewDecoder(hr.Body).Decode(&body)
	hr.Body.Close()
	if err != nil || hr.StatusCode != http.StatusOK || len(body.Decisions) != 2 || body.Decisions[1].Pool != "prefill" ||
		body.Decisions[1].AckReplicas != 2 || !body.Decisions[1].At.Equal(time.UnixMilli(1_780_000_000_000)) {
		t.Fatalf("GET %s: %d %v %+v", membership.PlannerDecisionsPath, hr.StatusCode, err, body)
	}
	if hr, err := http.Post(srv.URL+membership.PlannerDecisionsPath, "application/json", nil); err != nil || hr.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST %s: %v %v, want 405", membership.PlannerDecisionsPath, hr, err)
	}

	// The leader goes: the records stay, and the next leader takes writes.
	held := fmt.Sprint(leader.c.FSM().PlannerRecords())
	tc.stop(leader)
	tc.everyReplicaHolds(held)
	waitFor(t, 20*time.Second, "the others elect a new leader", func() bool {
		for _, m := range tc.running() {
			if l := m.c.Leader(); l == 0 || l == leader.id {
				return false
			}
		}
		return true
	})
	next := tc.leader()
	if _, err := tc.rpc(next).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: []*pb.PlannerDecision{plannerPB("prefill", 2, 2, 4)}}); err != nil {
		t.Fatalf("PutPlannerDecisions after the leader change: %v", err)
	}
	rec, _ := next.c.FSM().PlannerRecord("prefill")
	if rec.Seq != 2 || rec.Target != 4 || rec.AckSeq != 1 || rec.AckReplicas != 2 {
		t.Fatalf("prefill after the leader change: %+v", rec)
	}
	// The old leader comes back and catches up.
	tc.reopen(leader)
	tc.everyReplicaHolds(fmt.Sprint(next.c.FSM().PlannerRecords()))
}

func TestPlannerRecordsRefuseBadInputAndChangeNothing(t *testing.T) {
	tc := startCluster(t, 3)
	ctx := context.Background()
	leader, follower := tc.leader(), tc.follower()
	if _, err := tc.rpc(leader).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: []*pb.PlannerDecision{plannerPB("decode", 5, 1, 3)}}); err != nil {
		t.Fatal(err)
	}
	tc.everyReplicaHolds(fmt.Sprint(leader.c.FSM().PlannerRecords()))
	held := fmt.Sprint(leader.c.FSM().PlannerRecords())

	huge := strings.Repeat("x", raftstore.MaxWorkerField+1)
	with := func(change func(d *pb.PlannerDecision)) []*pb.PlannerDecision {
		d := plannerPB("decode", 6, 3, 4)
		change(d)
		return []*pb.PlannerDecision{d}
	}
	many := make([]*pb.PlannerDecision, raftstore.MaxPlannerRecords+1)
	for i := range many {
		many[i] = plannerPB("decode", 6, 3, 4)
	}
	bad := map[string][]*pb.PlannerDecision{
		"none":            nil,
		"too many":        many,
		"unknown pool":    with(func(d *pb.PlannerDecision) { d.Pool = "gpu" }),
		"negative target": with(func(d *pb.PlannerDecision) { d.Target = -1 }),
		"huge target":     with(func(d *pb.PlannerDecision) { d.Target = math.MaxInt64 }),
		"seq 0":           with(func(d *pb.PlannerDecision) { d.Seq = 0 }),
		"huge reason":     with(func(d *pb.PlannerDecision) { d.Reason = huge }),
		"NaN need":        with(func(d *pb.PlannerDecision) { d.Need = math.NaN() }),
	}
	badAcks := map[string]*pb.AckPlannerDecisionRequest{
		"unknown pool":      {Pool: "gpu", Seq: 5, Replicas: 3},
		"negative replicas": {Pool: "decode", Seq: 5, Replicas: -3},
		"seq 0":             {Pool: "decode", Replicas: 3},
	}
	for _, m := range []*member{leader, follower} {
		for name, ds := range bad {
			_, err := tc.rpc(m).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: ds})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("node %d, %s: PutPlannerDecisions = %v, want InvalidArgument", m.id, name, err)
			}
		}
		for name, req := range badAcks {
			if _, err := tc.rpc(m).AckPlannerDecision(ctx, req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("node %d, ack %s: %v, want InvalidArgument", m.id, name, err)
			}
		}
		// Well formed, but stale: refused by the replicated state itself.
		_, err := tc.rpc(m).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: []*pb.PlannerDecision{plannerPB("decode", 4, 1, 9)}})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("node %d: an older decision: %v, want FailedPrecondition", m.id, err)
		}
		if _, err := tc.rpc(m).AckPlannerDecision(ctx, &pb.AckPlannerDecisionRequest{Pool: "decode", Seq: 6, Replicas: 3}); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("node %d: an ack of an undecided seq: %v, want FailedPrecondition", m.id, err)
		}
	}
	// A write after them all is applied after anything wrongly let
	// through: then every replica still holds decode's record as it was.
	if _, err := tc.rpc(leader).PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: []*pb.PlannerDecision{plannerPB("aggregated", 1, 0, 1)}}); err != nil {
		t.Fatal(err)
	}
	tc.everyReplicaHolds(fmt.Sprint(leader.c.FSM().PlannerRecords()))
	for _, m := range tc.running() {
		rec, _ := m.c.FSM().PlannerRecord("decode")
		if got := fmt.Sprint([]raftstore.PlannerRecord{rec}); got != held {
			t.Fatalf("node %d: decode's record is %s after refused writes, was %s", m.id, got, held)
		}
	}
}

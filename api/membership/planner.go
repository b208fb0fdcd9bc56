package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/raftstore"
)

// This file serves the planner records (raftstore's PlannerRecord): each
// worker pool's latest scaling decision, which a planner with the virtual
// connector writes for an outside system, and that system's
// acknowledgement. Writes are forwarded to the leader like a worker's
// registration; reads answer from the local replica, over gRPC and over
// the node's HTTP listener (PlannerDecisionsPath).

// PlannerDecisionsPath is where the node's HTTP listener serves the
// planner records as JSON.
const PlannerDecisionsPath = "/v1/planner/decisions"

func (s *service) PutPlannerDecisions(ctx context.Context, req *pb.PutPlannerDecisionsRequest) (*pb.PutPlannerDecisionsResponse, error) {
	recs := make([]raftstore.PlannerRecord, len(req.GetDecisions()))
	for i, d := range req.GetDecisions() {
		r, err := plannerFromPB(d)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "planner decisions: %v", err)
		}
		recs[i] = r
	}
	if err := raftstore.CheckPlannerDecisions(recs); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.PutPlannerDecisionsResponse, error) {
			return cc.PutPlannerDecisions(ctx, req)
		})
	}
	if err := s.proposePlanner(ctx, raftstore.EncodePlannerPut(recs)); err != nil {
		return nil, err
	}
	return &pb.PutPlannerDecisionsResponse{}, nil
}

func (s *service) AckPlannerDecision(ctx context.Context, req *pb.AckPlannerDecisionRequest) (*pb.AckPlannerDecisionResponse, error) {
	if req.GetReplicas() < 0 || req.GetReplicas() > raftstore.MaxPlannerReplicas {
		return nil, status.Errorf(codes.InvalidArgument, "planner ack: pool %.64q: %d replicas, not 0 to %d",
			req.GetPool(), req.GetReplicas(), raftstore.MaxPlannerReplicas)
	}
	a := raftstore.PlannerAck{Pool: req.GetPool(), Seq: req.GetSeq(), Replicas: uint32(req.GetReplicas())}
	if err := raftstore.CheckPlannerAck(a); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.c.rep.IsLeader() {
		return forward(s, ctx, func(cc pb.ClusterClient) (*pb.AckPlannerDecisionResponse, error) {
			return cc.AckPlannerDecision(ctx, req)
		})
	}
	if err := s.proposePlanner(ctx, raftstore.EncodePlannerAck(a)); err != nil {
		return nil, err
	}
	return &pb.AckPlannerDecisionResponse{}, nil
}

func (s *service) ListPlannerDecisions(context.Context, *pb.ListPlannerDecisionsRequest) (*pb.ListPlannerDecisionsResponse, error) {
	return &pb.ListPlannerDecisionsResponse{Decisions: plannerRecordsToPB(s.c.rep.FSM.PlannerRecords())}, nil
}

// proposePlanner commits a planner entry through this node, the leader. A
// stale sequence number, found when the entry is applied, is
// FAILED_PRECONDITION.
func (s *service) proposePlanner(ctx context.Context, entry []byte) error {
	ctx, cancel := context.WithTimeout(ctx, registryTimeout)
	defer cancel()
	err := s.c.rep.Propose(ctx, entry)
	if errors.Is(err, raftstore.ErrPlannerStale) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		return toStatus(err)
	}
	return nil
}

// PlannerHandler serves GET PlannerDecisionsPath: the planner records of
// the agent's replica as JSON, {"decisions": [...]} with the fields of
// pb.PlannerDecision.
func PlannerHandler(c *Agent) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: GET the planner decisions", http.StatusMethodNotAllowed)
			return
		}
		ds := PlannerDecisionsJSON(plannerRecordsToPB(c.FSM().PlannerRecords()))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"decisions": ds})
	})
}

// PlannerDecisionJSON is a planner record as PlannerHandler and
// `kvctl planner status -o json` write it.
type PlannerDecisionJSON struct {
	Planner     string    `json:"planner,omitempty"`
	Pool        string    `json:"pool"`
	Seq         uint64    `json:"seq"`
	Current     int64     `json:"current"`
	Target      int64     `json:"target"`
	Need        float64   `json:"need"`
	Reason      string    `json:"reason,omitempty"`
	Mode        string    `json:"mode,omitempty"`
	Applied     bool      `json:"applied"`
	At          time.Time `json:"at"`
	AckSeq      uint64    `json:"ack_seq"`
	AckReplicas int64     `json:"ack_replicas"`
}

// PlannerDecisionsJSON converts records to their JSON form.
func PlannerDecisionsJSON(ds []*pb.PlannerDecision) []PlannerDecisionJSON {
	out := make([]PlannerDecisionJSON, len(ds))
	for i, d := range ds {
		out[i] = PlannerDecisionJSON{Planner: d.GetPlanner(), Pool: d.GetPool(), Seq: d.GetSeq(), Current: d.GetCurrent(),
			Target: d.GetTarget(), Need: d.GetNeed(), Reason: d.GetReason(), Mode: d.GetMode(), Applied: d.GetApplied(),
			At: time.UnixMilli(d.GetAtUnixMs()).UTC(), AckSeq: d.GetAckSeq(), AckReplicas: d.GetAckReplicas()}
	}
	return out
}

func plannerRecordsToPB(recs []raftstore.PlannerRecord) []*pb.PlannerDecision {
	out := make([]*pb.PlannerDecision, len(recs))
	for i, r := range recs {
		out[i] = &pb.PlannerDecision{Planner: r.Planner, Pool: r.Pool, Seq: r.Seq, Current: int64(r.Current),
			Target: int64(r.Target), Need: r.Need, Reason: r.Reason, Mode: r.Mode, Applied: r.Applied,
			AtUnixMs: r.At.UnixMilli(), AckSeq: r.AckSeq, AckReplicas: int64(r.AckReplicas)}
	}
	return out
}

// plannerFromPB converts a decision to a record, without its ack.
func plannerFromPB(d *pb.PlannerDecision) (raftstore.PlannerRecord, error) {
	for name, n := range map[string]int64{"current": d.GetCurrent(), "target": d.GetTarget()} {
		if n < 0 || n > raftstore.MaxPlannerReplicas {
			return raftstore.PlannerRecord{}, fmt.Errorf("pool %.64q: %s replicas %d, not 0 to %d", d.GetPool(), name, n, raftstore.MaxPlannerReplicas)
		}
	}
	return raftstore.PlannerRecord{Planner: d.GetPlanner(), Pool: d.GetPool(), Seq: d.GetSeq(),
		Current: uint32(d.GetCurrent()), Target: uint32(d.GetTarget()), Need: d.GetNeed(), Reason: d.GetReason(),
		Mode: d.GetMode(), Applied: d.GetApplied(), At: time.UnixMilli(d.GetAtUnixMs()).UTC()}, nil
}

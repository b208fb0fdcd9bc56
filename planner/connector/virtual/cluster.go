package virtual

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/planner"
)

// Cluster is a Store in the cache cluster's replicated state, through the
// Go client: every node serves the same records, and they survive a
// restart and a leader change. It is safe for concurrent use.
type Cluster struct {
	c *client.Client
	// Planner names the writer in each record; the default is "planner".
	Planner string
}

var _ Store = (*Cluster)(nil)

// NewCluster returns a Store over the cluster c talks to.
func NewCluster(c *client.Client) *Cluster { return &Cluster{c: c, Planner: "planner"} }

// Put implements Store. It checks the decisions first (Validate), so a
// malformed one never reaches the cluster.
func (s *Cluster) Put(ctx context.Context, ds []planner.Decision) error {
	msgs := make([]*pb.PlannerDecision, len(ds))
	for i, d := range ds {
		if err := Validate(d); err != nil {
			return err
		}
		msgs[i] = &pb.PlannerDecision{Planner: s.Planner, Pool: string(d.Pool), Seq: d.Seq, Current: int64(d.Current),
			Target: int64(d.Target), Need: d.Need, Reason: d.Reason, Mode: d.Mode, Applied: d.Applied,
			AtUnixMs: d.At.UnixMilli()}
	}
	return storeError(s.c.PutPlannerDecisions(ctx, msgs))
}

// Latest implements Store.
func (s *Cluster) Latest(ctx context.Context) ([]Record, error) {
	ds, err := s.c.PlannerDecisions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Record, len(ds))
	for i, d := range ds {
		out[i] = RecordFromPB(d)
	}
	return out, nil
}

// Ack implements Store.
func (s *Cluster) Ack(ctx context.Context, pool planner.Pool, seq uint64, replicas int) error {
	if err := ValidateAck(pool, seq, replicas); err != nil {
		return err
	}
	return storeError(s.c.AckPlannerDecision(ctx, string(pool), seq, int64(replicas)))
}

// RecordFromPB converts the cluster's record of a pool.
func RecordFromPB(d *pb.PlannerDecision) Record {
	return Record{
		Decision: planner.Decision{Seq: d.GetSeq(), At: time.UnixMilli(d.GetAtUnixMs()).UTC(), Pool: planner.Pool(d.GetPool()),
			Current: int(d.GetCurrent()), Target: int(d.GetTarget()), Need: d.GetNeed(), Reason: d.GetReason(),
			Mode: d.GetMode(), Applied: d.GetApplied()},
		AckSeq:      d.GetAckSeq(),
		AckReplicas: int(d.GetAckReplicas()),
	}
}

// storeError adds the Store's sentinel to the node's refusals:
// InvalidArgument is ErrInvalid, FailedPrecondition ErrStale.
func storeError(err error) error {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return err
	}
	switch ce.Code {
	case codes.InvalidArgument:
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case codes.FailedPrecondition:
		return fmt.Errorf("%w: %w", ErrStale, err)
	}
	return err
}

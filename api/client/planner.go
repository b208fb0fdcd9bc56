package client

import (
	"context"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// The planner records of the kvstrata.v1.Cluster service: each worker
// pool's latest scaling decision, for an outside system to carry out and
// acknowledge.

// PutPlannerDecisions records each decision as its pool's latest, all or
// none. A malformed decision (unknown pool, sequence number 0, a negative
// count, a field too long) is an error matching ErrInvalid; one older than
// its pool's record has code FailedPrecondition.
func (c *Client) PutPlannerDecisions(ctx context.Context, ds []*pb.PlannerDecision) error {
	return c.call(ctx, "put-planner-decisions", func(ctx context.Context) error {
		_, err := c.cluster.PutPlannerDecisions(ctx, &pb.PutPlannerDecisionsRequest{Decisions: ds})
		return err
	})
}

// AckPlannerDecision says decision seq of pool was carried out and the
// pool runs replicas. A sequence number the record has not reached, or one
// before its last ack, has code FailedPrecondition.
func (c *Client) AckPlannerDecision(ctx context.Context, pool string, seq uint64, replicas int64) error {
	return c.call(ctx, "ack-planner-decision", func(ctx context.Context) error {
		_, err := c.cluster.AckPlannerDecision(ctx, &pb.AckPlannerDecisionRequest{Pool: pool, Seq: seq, Replicas: replicas})
		return err
	})
}

// PlannerDecisions lists every pool's record, by pool, as the node's
// replica knows them.
func (c *Client) PlannerDecisions(ctx context.Context) ([]*pb.PlannerDecision, error) {
	var resp *pb.ListPlannerDecisionsResponse
	err := c.call(ctx, "list-planner-decisions", func(ctx context.Context) (err error) {
		resp, err = c.cluster.ListPlannerDecisions(ctx, &pb.ListPlannerDecisionsRequest{})
		return err
	})
	return resp.GetDecisions(), err
}

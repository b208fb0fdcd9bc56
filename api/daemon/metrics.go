package daemon

import (
	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/api/metrics"
)

// clusterMetrics reads the node's view of its cluster for /metrics.
func clusterMetrics(cl *membership.Agent) metrics.ClusterFunc {
	return func() metrics.ClusterState {
		s, b := cl.RaftStats(), cl.BatcherStats()
		return metrics.ClusterState{IsLeader: s.IsLeader, Leader: uint64(s.Leader), Term: s.Term,
			CommitIndex: s.CommitIndex, AppliedIndex: s.AppliedIndex, LastContact: s.LastContact,
			Current: s.Current(), MembersUp: s.MembersUp, MembersDown: s.MembersDown,
			ReconcileCorrections: cl.ReconcileStats().Corrected,
			Publishing: metrics.Publishing{Queued: b.Added, Committed: b.Committed, Unchanged: cl.Unchanged(),
				Dropped: b.Dropped, Batches: b.Batches}}
	}
}

package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClusterState is a node's view of its cluster at scrape time.
type ClusterState struct {
	// IsLeader is whether this node leads raft; Leader is the leader's
	// node id, 0 while none is known.
	IsLeader bool
	Leader   uint64
	// Term is raft's current term; CommitIndex the last entry this node
	// knows committed, AppliedIndex the last its replica applied.
	Term, CommitIndex, AppliedIndex uint64
	// LastContact is how long ago a follower last heard from the leader:
	// 0 on the leader, negative if it never did.
	LastContact time.Duration
	// Current is whether the replica is current (the node's readiness).
	Current bool
	// MembersUp and MembersDown count the cluster's members by liveness
	// as the directory records it.
	MembersUp, MembersDown int
	// ReconcileCorrections counts the keys whose listing of this node its
	// reconcile passes corrected since it started.
	ReconcileCorrections uint64
	// Publishing counts the node's changes to the directory since it
	// started, by what became of them.
	Publishing Publishing
}

// Publishing counts a node's directory changes: proposed in batches, left
// out because they changed nothing, or dropped because the queue to raft
// was full (the reconcile pass restates those).
type Publishing struct {
	Queued, Committed, Unchanged, Dropped uint64
	// Batches counts the raft entries the committed changes went in.
	Batches uint64
}

// ClusterFunc returns the node's view of its cluster.
type ClusterFunc func() ClusterState

// WatchCluster exports the node's raft and membership state.
func (m *Metrics) WatchCluster(f ClusterFunc) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(clusterCollector(f))
}

var (
	descIsLeader    = clusterDesc("raft_is_leader", "1 while this node is the raft leader, else 0.")
	descLeaderID    = clusterDesc("raft_leader_id", "The raft leader's node id as this node knows it; 0 while it knows none.")
	descTerm        = clusterDesc("raft_term", "Raft's current term.")
	descCommit      = clusterDesc("raft_commit_index", "The last raft log index this node knows to be committed.")
	descApplied     = clusterDesc("raft_applied_index", "The last raft log index this node's replica of the directory applied.")
	descApplyLag    = clusterDesc("raft_apply_lag_entries", "Committed raft entries this node's replica has not applied yet (commit index less applied index).")
	descLastContact = clusterDesc("raft_last_contact_seconds", "How long ago this follower last heard from the leader; 0 on the leader, -1 if it never did.")
	descCurrent     = clusterDesc("raft_replica_current", "1 while this node's replica of the directory is current (it knows a leader, is in touch and caught up), else 0.")
	descReconcile   = prometheus.NewDesc(namespace+"_directory_reconcile_corrections_total", "Keys whose listing of this node in the directory a reconcile pass corrected (a lost publish: a phantom or a missing location).", nil, nil)
	descMembers     = prometheus.NewDesc(namespace+"_cluster_members", "The cluster's members by liveness (up, down) as the directory records it.", []string{"liveness"}, nil)
	descChanges     = prometheus.NewDesc(namespace+"_directory_changes_total", "This node's changes to the block directory by outcome: queued for raft, committed, unchanged (left out: the directory already listed them so), dropped (the queue to raft was full; reconciling restates them).", []string{"outcome"}, nil)
	descBatches     = prometheus.NewDesc(namespace+"_directory_batches_total", "Raft entries this node's committed directory changes went in.", nil, nil)
)

func clusterDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, nil, nil)
}

type clusterCollector ClusterFunc

func (c clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIsLeader, descLeaderID, descTerm, descCommit, descApplied, descApplyLag,
		descLastContact, descCurrent, descMembers, descReconcile, descChanges, descBatches} {
		ch <- d
	}
}

func (c clusterCollector) Collect(ch chan<- prometheus.Metric) {
	s := c()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descIsLeader, bit(s.IsLeader))
	gauge(descLeaderID, float64(s.Leader))
	gauge(descTerm, float64(s.Term))
	gauge(descCommit, float64(s.CommitIndex))
	gauge(descApplied, float64(s.AppliedIndex))
	gauge(descApplyLag, float64(s.CommitIndex-min(s.AppliedIndex, s.CommitIndex)))
	contact := s.LastContact.Seconds()
	if s.LastContact < 0 {
		contact = -1
	}
	gauge(descLastContact, contact)
	gauge(descCurrent, bit(s.Current))
	gauge(descMembers, float64(s.MembersUp), "up")
	gauge(descMembers, float64(s.MembersDown), "down")
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descReconcile, s.ReconcileCorrections)
	p := s.Publishing
	counter(descChanges, p.Queued, "queued")
	counter(descChanges, p.Committed, "committed")
	counter(descChanges, p.Unchanged, "unchanged")
	counter(descChanges, p.Dropped, "dropped")
	counter(descBatches, p.Batches)
}

func bit(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

package membership

import (
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// A node joins as a non-voter: it receives the log but counts in no
// quorum, so that adding a node that cannot be reached (a wrong address, a
// made-up member, a node that died while joining) never costs the cluster
// its quorum, as a voter would. The leader promotes it to voter once its
// heartbeats say it has applied the log up to within promoteLag entries of
// the commit index, as etcd promotes a learner. A node that is never heard
// stays a non-voter until it is removed.

// promoteLag is how many entries short of the leader's commit index a
// non-voter may be and still be promoted: a few batches of events, which
// a node that keeps up applies within a heartbeat.
const promoteLag = 256

// progress is what a node's last heartbeat said of its log.
type progress struct {
	applied uint64
	at      time.Time
}

// heardApplied records, on the leader, the applied index a heartbeat of
// node reported.
func (c *Agent) heardApplied(node index.NodeID, applied uint64) {
	c.mu.Lock()
	c.progress[node] = progress{applied: applied, at: time.Now()}
	c.mu.Unlock()
}

// promote, on the leader, makes voters of the non-voters that have caught
// up: heard within the liveness timeout, with an applied index within
// promoteLag of the commit index.
func (c *Agent) promote() {
	servers, err := c.rep.Servers()
	if err != nil {
		return
	}
	commit := c.rep.Raft.CommitIndex()
	for _, s := range servers {
		if s.Voter {
			continue
		}
		c.mu.Lock()
		p, ok := c.progress[s.ID]
		c.mu.Unlock()
		if !ok || time.Since(p.at) > c.cfg.LivenessTimeout || p.applied+promoteLag < commit {
			continue
		}
		if err := c.rep.AddVoter(s.ID, s.RaftAddr, c.cfg.LivenessTimeout); err != nil {
			c.log.Warn("promoting a non-voter", "node", s.ID, "err", err)
			continue
		}
		c.log.Info("node promoted to voter", "node", s.ID, "applied", p.applied, "commit", commit)
	}
}

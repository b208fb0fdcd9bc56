package membership

import (
	"errors"
	"fmt"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

// Why a replica is not current; Ready's errors wrap one of them.
var (
	// ErrOutOfTouch: the node knows a leader but has not heard from it
	// for longer than an election timeout.
	ErrOutOfTouch = errors.New("cluster: out of touch with the leader")
	// ErrCatchingUp: the replica has not applied what the node knows to
	// be committed.
	ErrCatchingUp = errors.New("cluster: the replica is catching up")
)

// Freshness says how current this node's replica of the directory is, and
// so how far its lookups can be trusted.
type Freshness struct {
	// Leader is the leader the node knows, 0 for none.
	Leader index.NodeID
	// LastContact is how long ago the node last heard from the leader: 0
	// on the leader, negative if it never did since it started.
	LastContact time.Duration
	// AppliedIndex is the last raft entry the replica applied;
	// CommitIndex the last the node knows to be committed.
	AppliedIndex, CommitIndex uint64
	// Err is nil when the replica is current: the node knows a leader (or
	// is it), heard from it within an election timeout, and has applied
	// everything it knew to be committed a moment ago (freshTick) and, on
	// a follower, what the leader had committed when it answered the
	// heartbeat before last. Else it wraps ErrNoLeader, ErrOutOfTouch or
	// ErrCatchingUp.
	Err error
}

// Current reports whether the replica is current (Err is nil).
func (f Freshness) Current() bool { return f.Err == nil }

// freshTick is how often the tracker samples the commit index: a replica
// is caught up once it has applied what was committed one tick ago.
const freshTick = 100 * time.Millisecond

// freshTracker holds the commit index a replica must have applied to be
// caught up. Guarded by Agent.mu.
type freshTracker struct {
	target, last uint64 // the commit index this node knew one tick ago, and now
	// The leader's commit index as its answers to this node's last two
	// heartbeats said, the older first: a follower far behind learns
	// from raft only the commit index of what it has received so far.
	// leader is the node that answered them: a new leader's answers start
	// afresh, so that a deposed leader back from a partition, or a node
	// that followed another leader, is not current on old answers.
	leaderTarget, leaderLast uint64
	leader                   index.NodeID
}

// leaderCommitted records the commit index leader gave in its answer to a
// heartbeat.
func (c *Agent) leaderCommitted(leader index.NodeID, commit uint64) {
	c.mu.Lock()
	if c.fresh.leader != leader {
		c.fresh.leader, c.fresh.leaderTarget = leader, 0
	} else {
		c.fresh.leaderTarget = c.fresh.leaderLast
	}
	c.fresh.leaderLast = commit
	c.mu.Unlock()
}

// sampleFreshness samples the commit index (every freshTick).
func (c *Agent) sampleFreshness() {
	commit := c.rep.Raft.CommitIndex()
	// A node that leads, knows no leader or is out of touch with it
	// forgets the leader's answers: once in touch again, it is
	// current only after two fresh ones.
	forget := c.rep.IsLeader() || c.rep.Leader() == 0 || time.Since(c.rep.Raft.LastContact()) > c.rep.ElectionTimeout()
	c.mu.Lock()
	c.fresh.target, c.fresh.last = c.fresh.last, commit
	if forget {
		c.fresh.leader, c.fresh.leaderTarget, c.fresh.leaderLast = 0, 0, 0
	}
	c.mu.Unlock()
}

// Freshness reports how current the node's replica is.
func (c *Agent) Freshness() Freshness {
	f := Freshness{Leader: c.rep.Leader(), AppliedIndex: c.rep.FSM.AppliedIndex(), CommitIndex: c.rep.Raft.CommitIndex()}
	leads := c.rep.IsLeader()
	if !leads {
		if last := c.rep.Raft.LastContact(); last.IsZero() {
			f.LastContact = -1
		} else {
			f.LastContact = time.Since(last)
		}
	}
	c.mu.Lock()
	target, leaderTarget := c.fresh.target, c.fresh.leaderTarget
	if c.fresh.leader != f.Leader {
		leaderTarget = 0 // no answers from this leader yet
	}
	c.mu.Unlock()
	if !leads { // a follower: at most a heartbeat or two behind the leader
		target = max(target, leaderTarget)
	}
	switch {
	case f.Leader == 0:
		f.Err = ErrNoLeader
	case !leads && (f.LastContact < 0 || f.LastContact > c.rep.ElectionTimeout()):
		f.Err = fmt.Errorf("%w: last heard from node %d %v ago", ErrOutOfTouch, f.Leader, f.LastContact.Round(time.Millisecond))
	case !leads && leaderTarget == 0:
		f.Err = fmt.Errorf("%w: the leader has not yet answered two heartbeats with its commit index", ErrCatchingUp)
	case target == 0 || !c.rep.CaughtUp(target):
		f.Err = fmt.Errorf("%w: applied index %d, committed %d", ErrCatchingUp, f.AppliedIndex, max(target, f.CommitIndex))
	}
	return f
}

// Ready returns nil when the node's replica is current, else why not
// (wrapping ErrNoLeader, ErrOutOfTouch or ErrCatchingUp): what the node's
// readiness and health report.
func (c *Agent) Ready() error { return c.Freshness().Err }

// FreshnessToPB turns f into its message in lookup answers.
func FreshnessToPB(f Freshness) *pb.Freshness {
	out := &pb.Freshness{Current: f.Current(), LeaderId: uint32(f.Leader), LastContactMs: f.LastContact.Milliseconds(),
		AppliedIndex: f.AppliedIndex, CommitIndex: f.CommitIndex}
	if f.LastContact < 0 {
		out.LastContactMs = -1
	}
	if f.Err != nil {
		out.Reason = f.Err.Error()
	}
	return out
}

package membership

import (
	"context"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// capacitiesEvery is how often the leader records a node's tier usage in
// the replicated state.
const capacitiesEvery = 5 * time.Second

// heartbeat tells the leader that this node is alive and how full its
// tiers are (every HeartbeatInterval).
func (c *Agent) heartbeat() {
	var usage []raftstore.TierUsage
	c.mu.Lock()
	usageFn := c.usage
	c.mu.Unlock()
	if usageFn != nil {
		usage = usageFn()
	}
	if c.rep.IsLeader() {
		c.heard(c.cfg.ID, usage)
		return
	}
	leader := c.rep.Leader()
	conn, err := c.leaderConn()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.HeartbeatInterval)
	resp, err := pb.NewClusterClient(conn).Heartbeat(ctx, &pb.HeartbeatRequest{Id: uint32(c.cfg.ID), Tiers: usageToPB(usage),
		AppliedIndex: c.rep.FSM.AppliedIndex()})
	cancel()
	if err == nil {
		c.leaderCommitted(leader, resp.CommitIndex)
	}
}

// heard records, on the leader, a heartbeat of node, and proposes its tier
// usage when the last record is old.
func (c *Agent) heard(node index.NodeID, usage []raftstore.TierUsage) {
	now := time.Now()
	c.mu.Lock()
	if c.lead.seen != nil {
		c.lead.seen[node] = now
	}
	due := len(usage) > 0 && now.Sub(c.caps[node]) >= capacitiesEvery
	if due {
		c.caps[node] = now
	}
	c.mu.Unlock()
	if due {
		if _, ok := c.rep.FSM.Member(node); ok {
			go c.proposeNow(raftstore.EncodeCapacities(raftstore.Capacities{Node: node, At: now, Tiers: usage}))
		}
	}
}

// leadership is what the monitor has observed while this node leads: it
// belongs to one raft term, and is started afresh in each.
type leadership struct {
	term uint64 // 0: not leading
	// since is when this leader started listening, or listened again after
	// a gap (the process was paused): nobody is silent for longer.
	since time.Time
	tick  time.Time                  // the monitor's last pass
	seen  map[index.NodeID]time.Time // last heartbeat of each node
}

// monitorOnce runs on every node, every HeartbeatInterval, and acts while
// it leads: it keeps this node's member record current and marks members
// down when they fall silent for LivenessTimeout, and up when they are
// heard again.
//
// A decision rests only on what this node observed while leading in the
// current term: the observations start afresh on each new term and after
// a gap in the monitor's passes (a paused process heard nobody), each
// decision is proposed through this node's raft only (never forwarded),
// while it still leads in that term, and carries the term, so that the
// replicas apply it only if this leader appended it in that term
// (raftstore.EntryLivenessInTerm). A deposed leader that wakes up with old
// observations thus changes nothing.
func (c *Agent) monitorOnce() {
	c.registerSelf()
	term := c.rep.Term()
	if !c.rep.IsLeader() {
		c.mu.Lock()
		c.lead = leadership{}
		c.mu.Unlock()
		return
	}
	c.promote()
	c.expireWorkers()
	changes, up := c.livenessChanges(term, time.Now())
	for i, m := range changes {
		if !c.rep.IsLeader() || c.rep.Term() != term {
			break // deposed meanwhile: the next leader decides
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.forwardTimeout())
		err := c.rep.Propose(ctx, raftstore.EncodeLivenessInTerm(term, m.ID, up[i], time.Now()))
		cancel()
		if err == nil {
			c.log.Info("liveness", "node", m.ID, "up", up[i], "term", term)
		}
	}
}

// livenessChanges returns the members whose liveness the leader of term
// should change at now, and whether each is up.
func (c *Agent) livenessChanges(term uint64, now time.Time) ([]raftstore.Member, []bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &c.lead
	if l.term != term || now.Sub(l.tick) > c.cfg.LivenessTimeout/2 {
		// A new term, or a gap: listen afresh, giving every member a
		// full timeout.
		*l = leadership{term: term, since: now, seen: map[index.NodeID]time.Time{}}
	}
	l.tick = now
	var changes []raftstore.Member
	var up []bool
	for _, m := range c.rep.FSM.Members() {
		last := l.seen[m.ID]
		if last.Before(l.since) {
			last = l.since
		}
		silent := now.Sub(last) > c.cfg.LivenessTimeout
		if alive := c.rep.FSM.Alive(m.ID); alive == silent {
			changes, up = append(changes, m), append(up, !silent)
		}
	}
	return changes, up
}

// registerSelf proposes this node's member record while the replica's
// differs from it (a new node, or one whose addresses changed).
func (c *Agent) registerSelf() {
	c.mu.Lock()
	self := c.self
	c.mu.Unlock()
	if m, ok := c.rep.FSM.Member(self.ID); ok && m == self {
		c.registered.Store(true)
		return
	}
	if err := c.proposeNow(raftstore.EncodeMemberUpsert(self)); err != nil {
		c.log.Debug("registering this node", "err", err)
		return
	}
	c.registered.Store(true)
}

// proposeNow commits one entry outside the batcher.
func (c *Agent) proposeNow(entry []byte) error {
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	return c.propose(ctx, entry)
}

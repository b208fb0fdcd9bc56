package cluster

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

// heartbeats tells the leader, every HeartbeatInterval, that this node is
// alive and how full its tiers are.
func (c *Cluster) heartbeats() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		var usage []raftstore.TierUsage
		c.mu.Lock()
		usageFn := c.usage
		c.mu.Unlock()
		if usageFn != nil {
			usage = usageFn()
		}
		if c.rep.IsLeader() {
			c.heard(c.cfg.ID, usage)
			continue
		}
		conn, err := c.leaderConn()
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.HeartbeatInterval)
		_, _ = pb.NewClusterClient(conn).Heartbeat(ctx, &pb.HeartbeatRequest{Id: uint32(c.cfg.ID), Tiers: usageToPB(usage),
			AppliedIndex: c.rep.Raft.AppliedIndex()})
		cancel()
	}
}

// heard records, on the leader, a heartbeat of node, and proposes its tier
// usage when the last record is old.
func (c *Cluster) heard(node index.NodeID, usage []raftstore.TierUsage) {
	now := time.Now()
	c.mu.Lock()
	c.seen[node] = now
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

// monitor runs on every node and acts while it leads: it keeps this node's
// member record current and marks members down when they fall silent for
// LivenessTimeout, and up when they are heard again.
func (c *Cluster) monitor() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.registerSelf()
		if !c.rep.IsLeader() {
			c.mu.Lock()
			c.leads = false
			c.mu.Unlock()
			continue
		}
		c.promote()
		now := time.Now()
		c.mu.Lock()
		if !c.leads { // a new leader gives every member a full timeout
			c.leads = true
			for _, m := range c.rep.FSM.Members() {
				c.seen[m.ID] = now
			}
		}
		var changes []raftstore.Member
		var up []bool
		for _, m := range c.rep.FSM.Members() {
			last, ok := c.seen[m.ID]
			if !ok {
				c.seen[m.ID], last = now, now
			}
			silent := now.Sub(last) > c.cfg.LivenessTimeout
			if alive := c.rep.FSM.Alive(m.ID); alive == silent {
				changes, up = append(changes, m), append(up, !silent)
			}
		}
		c.mu.Unlock()
		for i, m := range changes {
			if err := c.proposeNow(raftstore.EncodeLiveness(m.ID, up[i], now)); err == nil {
				c.log.Info("liveness", "node", m.ID, "up", up[i])
			}
		}
	}
}

// registerSelf proposes this node's member record while the replica's
// differs from it (a new node, or one whose addresses changed).
func (c *Cluster) registerSelf() {
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
func (c *Cluster) proposeNow(entry []byte) error {
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	return c.propose(ctx, entry)
}

package membership

// RaftStats is this node's view of raft and of the members, for metrics.
type RaftStats struct {
	// Freshness is how current the replica is: the leader, the last
	// contact with it, the commit and applied indices.
	Freshness
	// IsLeader is whether this node leads; Term is raft's current term.
	IsLeader bool
	Term     uint64
	// MembersUp and MembersDown count the members by the liveness the
	// directory records (a member never marked is up).
	MembersUp, MembersDown int
}

// RaftStats reports this node's view of raft and of the members.
func (c *Agent) RaftStats() RaftStats {
	s := RaftStats{Freshness: c.Freshness(), IsLeader: c.rep.IsLeader(), Term: c.rep.Term()}
	for _, m := range c.rep.FSM.Members() {
		if c.rep.FSM.Alive(m.ID) {
			s.MembersUp++
		} else {
			s.MembersDown++
		}
	}
	return s
}

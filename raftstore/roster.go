package raftstore

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Member is one cache node of the cluster.
type Member struct {
	ID        index.NodeID // never index.AnyNode (0)
	Name      string       // for people: logs, kvctl
	RaftAddr  string       // where its raft transport listens
	GRPCAddr  string       // its control plane (api/v1)
	DataAddr  string       // its data plane (transfer)
	Transport string       // the data plane's transport: "tcp", "ucx", …
}

// Liveness is whether a member is up, and since when.
type Liveness struct {
	Up bool
	// Since is when the change was observed, as the proposer of the
	// entry recorded it (replicas never read their own clocks).
	Since time.Time
}

// TierUsage is one tier of a node: its capacity and how much is used.
type TierUsage struct {
	Tier     index.TierKind
	Capacity uint64 // bytes
	Used     uint64 // bytes
	Blocks   uint64 // blocks held
}

// Capacities is a node's report of its tiers.
type Capacities struct {
	Node  index.NodeID
	At    time.Time // when the node measured them
	Tiers []TierUsage
}

// Roster is a copy of the cluster state an FSM holds.
type Roster struct {
	Members    []Member // by ID
	Liveness   map[index.NodeID]Liveness
	Capacities map[index.NodeID]Capacities
}

// roster is the FSM's cluster state. A value is never changed once
// published: a change makes a changed copy (the state is small, and its
// changes rare), so readers load it with no lock and a snapshot keeps a
// pointer.
type roster struct {
	members    map[index.NodeID]Member
	liveness   map[index.NodeID]Liveness
	capacities map[index.NodeID]Capacities
	// usable says whether a directory lookup may use a location: not if
	// its node is marked down. Nil when no node is down.
	usable func(index.Location) bool
}

func newRoster() *roster {
	return &roster{
		members:    map[index.NodeID]Member{},
		liveness:   map[index.NodeID]Liveness{},
		capacities: map[index.NodeID]Capacities{},
	}
}

// clone returns a copy of s to change and then seal.
func (s *roster) clone() *roster {
	return &roster{
		members:    maps.Clone(s.members),
		liveness:   maps.Clone(s.liveness),
		capacities: maps.Clone(s.capacities),
	}
}

// seal computes what is derived from s, before s is published.
func (s *roster) seal() *roster {
	down := map[index.NodeID]bool{}
	for id, l := range s.liveness {
		if !l.Up {
			down[id] = true
		}
	}
	s.usable = nil
	if len(down) > 0 {
		s.usable = func(l index.Location) bool { return l.Node == index.AnyNode || !down[l.Node] }
	}
	return s
}

// alive reports whether node is not marked down.
func (s *roster) alive(node index.NodeID) bool {
	l, ok := s.liveness[node]
	return !ok || l.Up
}

// sortedMembers returns the members by ID.
func (s *roster) sortedMembers() []Member {
	ms := slices.Collect(maps.Values(s.members))
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	return ms
}

// public returns a copy of s for callers.
func (s *roster) public() Roster {
	c := Roster{
		Members:    s.sortedMembers(),
		Liveness:   maps.Clone(s.liveness),
		Capacities: make(map[index.NodeID]Capacities, len(s.capacities)),
	}
	for id, caps := range s.capacities {
		caps.Tiers = slices.Clone(caps.Tiers)
		c.Capacities[id] = caps
	}
	return c
}

// The changes below return the changed state, or s and a business error.

func (s *roster) upsertMember(m Member) (*roster, error) {
	if m.ID == index.AnyNode {
		return s, fmt.Errorf("%w: node id 0 stands for cluster-wide storage", ErrInvalidMember)
	}
	n := s.clone()
	n.members[m.ID] = m
	return n.seal(), nil
}

// removeMember forgets the member and its liveness and capacities.
func (s *roster) removeMember(id index.NodeID) (*roster, error) {
	if _, ok := s.members[id]; !ok {
		return s, fmt.Errorf("remove node %d: %w", id, ErrUnknownMember)
	}
	n := s.clone()
	delete(n.members, id)
	delete(n.liveness, id)
	delete(n.capacities, id)
	return n.seal(), nil
}

func (s *roster) setLiveness(id index.NodeID, l Liveness) (*roster, error) {
	if _, ok := s.members[id]; !ok {
		return s, fmt.Errorf("liveness of node %d: %w", id, ErrUnknownMember)
	}
	n := s.clone()
	n.liveness[id] = l
	return n.seal(), nil
}

func (s *roster) setCapacities(c Capacities) (*roster, error) {
	if _, ok := s.members[c.Node]; !ok {
		return s, fmt.Errorf("capacities of node %d: %w", c.Node, ErrUnknownMember)
	}
	n := s.clone()
	n.capacities[c.Node] = c
	return n.seal(), nil
}

// appendRoster appends the snapshot encoding of s: the members,
// liveness records and capacities, each by node id, each in the encoding
// of its entry type without the type byte.
func appendRoster(dst []byte, s *roster) []byte {
	dst = appendUvarint(dst, uint64(len(s.members)))
	for _, m := range s.sortedMembers() {
		dst = appendMember(dst, m)
	}
	dst = appendUvarint(dst, uint64(len(s.liveness)))
	for _, id := range slices.Sorted(maps.Keys(s.liveness)) {
		dst = appendLiveness(dst, id, s.liveness[id])
	}
	dst = appendUvarint(dst, uint64(len(s.capacities)))
	for _, id := range slices.Sorted(maps.Keys(s.capacities)) {
		dst = appendCapacities(dst, s.capacities[id])
	}
	return dst
}

// readRoster decodes what appendRoster encoded.
func readRoster(r *reader) *roster {
	s := newRoster()
	for n := r.count(); n > 0; n-- {
		m := readMember(r)
		s.members[m.ID] = m
	}
	for n := r.count(); n > 0; n-- {
		id, l := readLiveness(r)
		s.liveness[id] = l
	}
	for n := r.count(); n > 0; n-- {
		c := readCapacities(r)
		s.capacities[c.Node] = c
	}
	return s.seal()
}

package raftstore

import (
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
)

// FSM is the replicated state machine of the cluster: the global block
// directory (an *index.Directory) and the cluster state (members, their
// liveness, their tiers' capacities). It implements raft.BatchingFSM.
//
// Raft calls Apply, ApplyBatch, Snapshot and Restore from one goroutine;
// they must not be called concurrently with each other. The read methods
// (Directory, Lookup, Members, Alive, …) are safe for concurrent use with
// everything, and read the local replica: they may lag the leader.
//
// Entries are dispatched on their first byte, an EntryType. An entry that
// cannot be applied the same way on every replica panics: an unknown type
// without the Ignorable bit, or data that does not decode. An entry that
// decodes but is refused by the state (removing an unknown member, say)
// is applied as a no-op on every replica, and its error is the Apply
// result that raft hands to the proposer.
type FSM struct {
	dir     atomic.Pointer[index.Directory]
	state   atomic.Pointer[clusterState]
	applied atomic.Uint64
	events  atomic.Uint64
	skipped atomic.Uint64

	// pending holds the decoded events of the entries being applied;
	// only the apply goroutine uses it.
	pending []Event
}

var _ raft.BatchingFSM = (*FSM)(nil)

// maxPending bounds the events ApplyBatch decodes before it applies them,
// and the memory it keeps for the next call.
const maxPending = 64 << 10

// NewFSM returns an FSM with an empty directory and no members.
func NewFSM() *FSM {
	f := &FSM{}
	f.dir.Store(index.NewDirectory())
	f.state.Store(newClusterState().seal())
	return f
}

// Apply applies one committed entry. Raft calls ApplyBatch instead; Apply
// is there for the raft.FSM interface and for tests.
func (f *FSM) Apply(l *raft.Log) any {
	var out any
	if l.Type == raft.LogCommand {
		out = f.applyEntry(l)
	}
	f.applied.Store(l.Index)
	return out
}

// ApplyBatch applies committed entries in order and returns their results.
// The events of consecutive event entries go to the directory together.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	pending := f.pending[:0]
	flush := func() {
		if len(pending) > 0 {
			f.Directory().ApplyBatch(pending)
			f.events.Add(uint64(len(pending)))
			pending = pending[:0]
		}
	}
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		if len(l.Data) > 0 && EntryType(l.Data[0]) == EntryEvents {
			var err error
			if pending, err = DecodeEvents(pending, l.Data); err != nil {
				fatal(l.Index, err)
			}
			if len(pending) >= maxPending {
				flush()
			}
			continue
		}
		// Other entries see the events committed before them.
		flush()
		out[i] = f.applyEntry(l)
	}
	flush()
	if n := len(logs); n > 0 {
		f.applied.Store(logs[n-1].Index)
	}
	f.keepPending(pending)
	return out
}

// keepPending keeps p's memory for the next batch unless it grew large.
func (f *FSM) keepPending(p []Event) {
	if cap(p) > maxPending*2 {
		p = nil
	}
	f.pending = p[:0]
}

// fatal panics: the entry at index cannot be applied, and a replica that
// went on without it would diverge from its peers.
func fatal(index uint64, err error) {
	panic(fmt.Errorf("raftstore: apply entry %d: %w", index, err))
}

// applyEntry applies the command entry l and returns its result: nil, or
// the business error of a refused change.
func (f *FSM) applyEntry(l *raft.Log) any {
	idx, data := l.Index, l.Data
	if len(data) == 0 {
		fatal(idx, fmt.Errorf("%w: empty entry", ErrBadEntry))
	}
	switch t := EntryType(data[0]); t {
	case EntryEvents:
		evs, err := DecodeEvents(f.pending[:0], data)
		if err != nil {
			fatal(idx, err)
		}
		f.Directory().ApplyBatch(evs)
		f.events.Add(uint64(len(evs)))
		f.keepPending(evs)
		return nil
	case EntryMemberUpsert:
		m, err := decodeEntry(data, readMember)
		if err != nil {
			fatal(idx, err)
		}
		return f.change(func(s *clusterState) (*clusterState, error) { return s.upsertMember(m) })
	case EntryMemberRemove:
		id, err := decodeEntry(data, func(r *reader) index.NodeID { return index.NodeID(r.uint32()) })
		if err != nil {
			fatal(idx, err)
		}
		if err := f.change(func(s *clusterState) (*clusterState, error) { return s.removeMember(id) }); err != nil {
			return err
		}
		f.Directory().DropNode(id)
		return nil
	case EntryLiveness:
		type idLiveness struct {
			id index.NodeID
			l  Liveness
		}
		v, err := decodeEntry(data, func(r *reader) idLiveness {
			id, l := readLiveness(r)
			return idLiveness{id, l}
		})
		if err != nil {
			fatal(idx, err)
		}
		return f.change(func(s *clusterState) (*clusterState, error) { return s.setLiveness(v.id, v.l) })
	case EntryLivenessInTerm:
		type termLiveness struct {
			term uint64
			id   index.NodeID
			l    Liveness
		}
		v, err := decodeEntry(data, func(r *reader) termLiveness {
			term := r.uvarint()
			id, l := readLiveness(r)
			return termLiveness{term, id, l}
		})
		if err != nil {
			fatal(idx, err)
		}
		if v.term != l.Term { // the log's term, the same on every replica
			return fmt.Errorf("liveness of node %d decided in term %d, appended in term %d: %w", v.id, v.term, l.Term, ErrStaleTerm)
		}
		return f.change(func(s *clusterState) (*clusterState, error) { return s.setLiveness(v.id, v.l) })
	case EntryCapacities:
		c, err := decodeEntry(data, readCapacities)
		if err != nil {
			fatal(idx, err)
		}
		return f.change(func(s *clusterState) (*clusterState, error) { return s.setCapacities(c) })
	default:
		if t&Ignorable != 0 {
			f.skipped.Add(1)
			return nil
		}
		fatal(idx, fmt.Errorf("%w %v", ErrUnknownEntry, t))
		return nil
	}
}

// change publishes the cluster state fn makes of the current one, or
// returns fn's error and changes nothing. The result is an error
// interface: nil on success, so that raft hands a nil response.
func (f *FSM) change(fn func(*clusterState) (*clusterState, error)) error {
	n, err := fn(f.state.Load())
	if err != nil {
		return err
	}
	f.state.Store(n)
	return nil
}

// Directory returns the current directory. A Restore replaces it with a
// new one; a caller holding the old one keeps a consistent (if aging)
// view, so load it again for each request rather than keeping it.
func (f *FSM) Directory() *index.Directory { return f.dir.Load() }

// Lookup answers a longest-prefix lookup of chain in namespace ns from the
// local replica, ignoring the locations of nodes marked down. Cluster-wide
// locations (index.AnyNode: S3) always count.
func (f *FSM) Lookup(ns index.NamespaceID, chain []index.Hash) index.Prefix {
	return f.Directory().Lookup(ns, chain, f.state.Load().usable)
}

// Members returns the members, by ID.
func (f *FSM) Members() []Member { return f.state.Load().sortedMembers() }

// Member returns member id.
func (f *FSM) Member(id index.NodeID) (Member, bool) {
	m, ok := f.state.Load().members[id]
	return m, ok
}

// Alive reports whether node's locations count: true unless the node is
// marked down. A node never marked either way (a new member, or one that
// sends events before it joins) counts as alive, and so does AnyNode.
func (f *FSM) Alive(node index.NodeID) bool { return f.state.Load().alive(node) }

// Liveness returns the last liveness change recorded for member node.
func (f *FSM) Liveness(node index.NodeID) (Liveness, bool) {
	l, ok := f.state.Load().liveness[node]
	return l, ok
}

// Capacities returns the last tier report of member node.
func (f *FSM) Capacities(node index.NodeID) (Capacities, bool) {
	c, ok := f.state.Load().capacities[node]
	if ok {
		c.Tiers = append([]TierUsage(nil), c.Tiers...)
	}
	return c, ok
}

// Cluster returns a copy of the whole cluster state.
func (f *FSM) Cluster() ClusterState { return f.state.Load().public() }

// AppliedIndex returns the index of the last entry the FSM applied,
// counting those a restored snapshot holds: a caller that proposed an
// entry at index i reads its own write once AppliedIndex() >= i.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

// FSMStats counts what an FSM applied since it was made.
type FSMStats struct {
	Events  uint64 // directory events applied
	Skipped uint64 // entries of unknown ignorable types skipped
}

// Stats returns the FSM's counters.
func (f *FSM) Stats() FSMStats {
	return FSMStats{Events: f.events.Load(), Skipped: f.skipped.Load()}
}

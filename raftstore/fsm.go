package raftstore

import (
	"errors"
	"fmt"
	"log/slog"
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
// Entries are dispatched on their first byte, an EntryType. An unknown
// type without the Ignorable bit panics: it comes from a newer build, and
// a replica that went on without it would diverge from its peers — unless
// the operator lists its index in SkipEntries (cluster.skip-entries), for
// an entry that is known not to come from a newer build. An entry
// of a known type that does not decode is applied as a no-op on every
// replica, counted (FSMStats.Invalid) and logged: ValidateEntry keeps such
// entries out of the log, and one already there must not stop every
// replica on every restart. An entry that decodes but is refused by the
// state (removing an unknown member, say) is applied as a no-op on every
// replica too, and its error is the Apply result that raft hands to the
// proposer.
type FSM struct {
	dir     atomic.Pointer[index.Directory]
	state   atomic.Pointer[roster]
	workers atomic.Pointer[registry]       // nil: none (see registry.go)
	planner atomic.Pointer[plannerRecords] // nil: none (see planner.go)
	applied atomic.Uint64
	events  atomic.Uint64
	skipped atomic.Uint64
	// invalidEntries counts the entries applied as no-ops because they do
	// not decode.
	invalidEntries atomic.Uint64
	log            *slog.Logger // nil: slog.Default()
	// skip holds the indices of unknown entries to apply as no-ops (see
	// SkipEntries); set before raft starts, read-only after.
	skip map[uint64]struct{}

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
	f.state.Store(newRoster().seal())
	return f
}

// SkipEntries lists the raft log indices of command entries of unknown
// types (without the Ignorable bit) that the FSM applies as no-ops instead
// of panicking: the operator's way out when such an entry did not come
// from a newer build but from a build that let client input into the log
// unchecked. Each one skipped is logged at warn level and counted in
// FSMStats.Skipped. An entry at a listed index that the FSM can apply — a
// known type, an ignorable one, a raft configuration entry — is applied as
// usual (and the listing is logged), so that a mistyped index cannot make
// this replica diverge from one that is not given the list.
//
// Every replica holds the entry at the same index, so every node must be
// given the same list; a node not given it panics on the entry as before.
// Call SkipEntries before raft starts: it must not race Apply.
func (f *FSM) SkipEntries(indices ...uint64) {
	f.skip = nil
	for _, i := range indices {
		if f.skip == nil {
			f.skip = make(map[uint64]struct{}, len(indices))
		}
		f.skip[i] = struct{}{}
	}
}

// skips reports whether l is an entry listed in SkipEntries that the FSM
// cannot apply, and counts and logs it if so.
func (f *FSM) skips(l *raft.Log) bool {
	if _, ok := f.skip[l.Index]; !ok {
		return false
	}
	if l.Type != raft.LogCommand || len(l.Data) == 0 || knownType(EntryType(l.Data[0])) {
		f.logger().Warn("raftstore: cluster.skip-entries lists an entry this node can apply: applied as usual, not skipped",
			"index", l.Index, "log_type", l.Type.String(), "type", entryTypeOf(l.Data))
		return false
	}
	f.skipped.Add(1)
	f.logger().Warn("raftstore: skipped an entry of an unknown type as cluster.skip-entries lists it",
		"index", l.Index, "type", entryTypeOf(l.Data))
	return true
}

// knownType reports whether the FSM applies entries of type t (or may
// ignore them), rather than panicking.
func knownType(t EntryType) bool {
	_, ok := entryNames[t]
	return ok || t&Ignorable != 0
}

// entryTypeOf names the type of the entry data for a log line.
func entryTypeOf(data []byte) string {
	if len(data) == 0 {
		return "empty"
	}
	return EntryType(data[0]).String()
}

// Apply applies one committed entry. Raft calls ApplyBatch instead; Apply
// is there for the raft.FSM interface and for tests.
func (f *FSM) Apply(l *raft.Log) any {
	var out any
	switch {
	case f.skip != nil && f.skips(l):
		out = skippedResult(l.Index)
	case l.Type == raft.LogCommand:
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
		if f.skip != nil && f.skips(l) {
			out[i] = skippedResult(l.Index)
			continue
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if len(l.Data) > 0 && EntryType(l.Data[0]) == EntryEvents {
			n := len(pending)
			var err error
			if pending, err = DecodeEvents(pending, l.Data); err != nil {
				pending = pending[:n] // none of the entry's events
				out[i] = f.invalid(l.Index, err)
				continue
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

// skippedResult is the Apply result of an entry skipped as SkipEntries
// lists it.
func skippedResult(idx uint64) error {
	return fmt.Errorf("%w: entry %d skipped as cluster.skip-entries lists it", ErrUnknownEntry, idx)
}

// fatal panics: the entry at index is of an unknown type, and a replica
// that went on without it would diverge from its peers. The message tells
// the operator both ways out.
func fatal(index uint64, err error) {
	panic(fmt.Errorf("raftstore: apply entry %d: %w: if it comes from a newer kvstrata, upgrade this node; "+
		"if this entry is not from a newer kvstrata (e.g. it was injected before proposals were validated), "+
		"restart every node with --cluster-skip-entries %d", index, err, index))
}

// applyEntry applies the command entry l and returns its result: nil, or
// the business error of a refused change, or the error of an entry that
// does not decode.
func (f *FSM) applyEntry(l *raft.Log) any {
	idx := l.Index
	e, err := decode(f.pending[:0], l.Data)
	switch {
	case errors.Is(err, ErrUnknownEntry):
		fatal(idx, err)
	case err != nil:
		return f.invalid(idx, err)
	}
	switch e.typ {
	case EntryEvents:
		f.Directory().ApplyBatch(e.events)
		f.events.Add(uint64(len(e.events)))
		f.keepPending(e.events)
		return nil
	case EntryMemberUpsert:
		return f.change(func(s *roster) (*roster, error) { return s.upsertMember(e.member) })
	case EntryMemberRemove:
		if err := f.change(func(s *roster) (*roster, error) { return s.removeMember(e.node) }); err != nil {
			return err
		}
		f.Directory().DropNode(e.node)
		return nil
	case EntryLiveness:
		return f.change(func(s *roster) (*roster, error) { return s.setLiveness(e.node, e.liveness) })
	case EntryLivenessInTerm:
		if e.term != l.Term { // the log's term, the same on every replica
			return fmt.Errorf("liveness of node %d decided in term %d, appended in term %d: %w", e.node, e.term, l.Term, ErrStaleTerm)
		}
		return f.change(func(s *roster) (*roster, error) { return s.setLiveness(e.node, e.liveness) })
	case EntryCapacities:
		return f.change(func(s *roster) (*roster, error) { return s.setCapacities(e.caps) })
	case EntryWorkerUpsert, EntryWorkerRemove, EntryWorkerExpire:
		return f.applyRegistry(e)
	case EntryPlannerPut, EntryPlannerAck:
		return f.applyPlanner(e)
	default: // an unknown ignorable type
		f.skipped.Add(1)
		return nil
	}
}

// invalid counts and logs the entry at index, which does not decode and
// is applied as a no-op, and returns its Apply result.
//
// Every replica holds the same bytes at the same index (a damaged copy on
// one replica's disk fails Pebble's checksums before it gets here), and a
// known type's encoding never changes, so every replica skips the same
// entries and none diverges. Such an entry can only come from a build that
// did not validate proposals, or from a bug; stopping every replica on it
// forever, as an unknown type does, would help no one.
func (f *FSM) invalid(idx uint64, err error) error {
	f.invalidEntries.Add(1)
	f.logger().Error("raftstore: applied an undecodable entry as a no-op", "index", idx, "err", err)
	return fmt.Errorf("%w: entry %d: %w", ErrInvalidEntry, idx, err)
}

func (f *FSM) logger() *slog.Logger {
	if f.log == nil {
		return slog.Default()
	}
	return f.log
}

// change publishes the cluster state fn makes of the current one, or
// returns fn's error and changes nothing. The result is an error
// interface: nil on success, so that raft hands a nil response.
func (f *FSM) change(fn func(*roster) (*roster, error)) error {
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
func (f *FSM) Roster() Roster { return f.state.Load().public() }

// AppliedIndex returns the index of the last entry the FSM applied,
// counting those a restored snapshot holds: a caller that proposed an
// entry at index i reads its own write once AppliedIndex() >= i.
func (f *FSM) AppliedIndex() uint64 { return f.applied.Load() }

// FSMStats counts what an FSM applied since it was made.
type FSMStats struct {
	Events  uint64 // directory events applied
	Skipped uint64 // entries of unknown types skipped: ignorable ones, and those SkipEntries lists
	Invalid uint64 // entries of known types that did not decode, applied as no-ops
}

// Stats returns the FSM's counters.
func (f *FSM) Stats() FSMStats {
	return FSMStats{Events: f.events.Load(), Skipped: f.skipped.Load(), Invalid: f.invalidEntries.Load()}
}

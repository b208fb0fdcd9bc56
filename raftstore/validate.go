package raftstore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// This file holds the one decoding of an entry that both the FSM and the
// checks before the log use, and those checks: what goes into the log is
// what the FSM can apply.

// decoded is an entry as the FSM applies it: the fields of its type.
type decoded struct {
	typ      EntryType
	events   []Event      // EntryEvents
	member   Member       // EntryMemberUpsert
	node     index.NodeID // EntryMemberRemove, EntryLiveness, EntryLivenessInTerm
	liveness Liveness     // EntryLiveness, EntryLivenessInTerm
	term     uint64       // EntryLivenessInTerm: the term its leader decided in
	caps     Capacities   // EntryCapacities
	worker   Worker       // EntryWorkerUpsert
	url      string       // EntryWorkerRemove
	cutoff   time.Time    // EntryWorkerExpire
	// EntryPlannerPut, EntryPlannerAck
	plannerPut []PlannerRecord
	plannerAck PlannerAck
}

// decode decodes the entry data, appending the events of an EntryEvents
// entry to dst. An entry of an unknown type with the Ignorable bit decodes
// to its type alone. An error wraps ErrBadEntry, or ErrUnknownEntry for an
// unknown type without the Ignorable bit.
func decode(dst []Event, data []byte) (decoded, error) {
	if len(data) == 0 {
		return decoded{}, fmt.Errorf("%w: empty entry", ErrBadEntry)
	}
	e := decoded{typ: EntryType(data[0])}
	var err error
	switch e.typ {
	case EntryEvents:
		e.events, err = DecodeEvents(dst, data)
	case EntryMemberUpsert:
		e.member, err = decodeEntry(data, readMember)
	case EntryMemberRemove:
		e.node, err = decodeEntry(data, func(r *reader) index.NodeID { return index.NodeID(r.uint32()) })
	case EntryLiveness:
		type idLiveness struct {
			id index.NodeID
			l  Liveness
		}
		var v idLiveness
		v, err = decodeEntry(data, func(r *reader) idLiveness {
			id, l := readLiveness(r)
			return idLiveness{id, l}
		})
		e.node, e.liveness = v.id, v.l
	case EntryLivenessInTerm:
		type termLiveness struct {
			term uint64
			id   index.NodeID
			l    Liveness
		}
		var v termLiveness
		v, err = decodeEntry(data, func(r *reader) termLiveness {
			term := r.uvarint()
			id, l := readLiveness(r)
			return termLiveness{term, id, l}
		})
		e.term, e.node, e.liveness = v.term, v.id, v.l
	case EntryCapacities:
		e.caps, err = decodeEntry(data, readCapacities)
	case EntryWorkerUpsert:
		e.worker, err = decodeEntry(data, readWorker)
	case EntryWorkerRemove:
		e.url, err = decodeEntry(data, (*reader).string)
	case EntryWorkerExpire:
		e.cutoff, err = decodeEntry(data, (*reader).time)
	case EntryPlannerPut:
		e.plannerPut, err = decodeEntry(data, readPlannerPut)
	case EntryPlannerAck:
		e.plannerAck, err = decodeEntry(data, readPlannerAck)
	default:
		if e.typ&Ignorable == 0 {
			err = fmt.Errorf("%w %v", ErrUnknownEntry, e.typ)
		}
	}
	return e, err
}

// ValidateEntry reports whether data may be proposed: it decodes data as
// the FSM does when it applies it, and checks what the entry says: a
// known type (or one a replica may ignore), member ids > 0, known tiers,
// worker records within the registry's bounds (CheckWorker).
// Every proposal passes it before it reaches the log (RaftPropose), so
// that what a caller sends can never stop a replica. An error wraps
// ErrInvalidEntry, and ErrBadEntry or ErrUnknownEntry when data does not
// decode.
func ValidateEntry(data []byte) error {
	buf := eventBufs.Get().(*[]Event)
	e, err := decode((*buf)[:0], data)
	if err == nil {
		err = e.check()
	}
	if cap(e.events) <= maxPending {
		*buf = e.events[:0]
	}
	eventBufs.Put(buf)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEntry, err)
	}
	return nil
}

// eventBufs holds the memory ValidateEntry decodes event batches into.
var eventBufs = sync.Pool{New: func() any { return new([]Event) }}

// check checks what a decoded entry says.
func (e *decoded) check() error {
	switch e.typ {
	case EntryEvents:
		for i, ev := range e.events {
			if err := checkEvent(ev); err != nil {
				return fmt.Errorf("event %d of %d: %w", i, len(e.events), err)
			}
		}
	case EntryMemberUpsert:
		m := e.member
		if m.ID == index.AnyNode || m.RaftAddr == "" || m.GRPCAddr == "" {
			return fmt.Errorf("member-upsert: node %d with raft address %q and gRPC address %q: a member needs an id > 0 and both addresses",
				m.ID, m.RaftAddr, m.GRPCAddr)
		}
	case EntryMemberRemove, EntryLiveness, EntryLivenessInTerm:
		if e.node == index.AnyNode {
			return fmt.Errorf("%v: node id 0 stands for cluster-wide storage, not a member", e.typ)
		}
	case EntryCapacities:
		if e.caps.Node == index.AnyNode {
			return errors.New("capacities: node id 0 stands for cluster-wide storage, not a member")
		}
		for _, t := range e.caps.Tiers {
			if !knownTier(t.Tier) {
				return fmt.Errorf("capacities: unknown tier %v", t.Tier)
			}
		}
	case EntryWorkerUpsert:
		return CheckWorker(e.worker)
	case EntryWorkerRemove:
		if e.url == "" || len(e.url) > MaxWorkerField {
			return fmt.Errorf("worker-remove: a URL of %d bytes, not 1 to %d", len(e.url), MaxWorkerField)
		}
	case EntryPlannerPut:
		return CheckPlannerDecisions(e.plannerPut)
	case EntryPlannerAck:
		return CheckPlannerAck(e.plannerAck)
	}
	return nil
}

// checkEvent checks one directory event.
func checkEvent(ev Event) error {
	if ev.Kind == EventNodeDropped {
		if ev.Loc.Node == index.AnyNode {
			return errors.New("node-dropped event of node 0, which stands for cluster-wide storage")
		}
		return nil
	}
	if !knownTier(ev.Loc.Tier) {
		return fmt.Errorf("location %v: unknown tier", ev.Loc)
	}
	return nil
}

func knownTier(t index.TierKind) bool { return t >= index.TierHBM && t <= index.TierS3 }

// CheckForwarded reports whether member from may have the valid entry
// data committed through another node (the leader), as a member forwards
// what it proposes while it does not lead: its directory events, about its
// own locations and cluster-wide ones, and its own member record. Entries
// that only a leader makes (liveness, removals, other members' records,
// capacities, which the leader records from heartbeats, and the worker
// registry, which the leader keeps for the workers) are not taken from
// another node, nor is anything from node 0. Entries of unknown ignorable
// types, which a newer member may make, pass. An error wraps
// ErrNotForwardable.
func CheckForwarded(data []byte, from index.NodeID) error {
	e, err := decode(nil, data)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEntry, err)
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: node %d: %v entry: %s", ErrNotForwardable, from, e.typ, fmt.Sprintf(format, args...))
	}
	if from == index.AnyNode {
		return refuse("no proposing member named")
	}
	switch e.typ {
	case EntryEvents:
		for i, ev := range e.events {
			if ev.Loc.Node != from && (ev.Loc.Node != index.AnyNode || ev.Kind == EventNodeDropped) {
				return refuse("event %d is about node %d's blocks", i, ev.Loc.Node)
			}
		}
	case EntryMemberUpsert:
		if e.member.ID != from {
			return refuse("the record of node %d", e.member.ID)
		}
	case EntryMemberRemove, EntryLiveness, EntryLivenessInTerm, EntryCapacities,
		EntryWorkerUpsert, EntryWorkerRemove, EntryWorkerExpire, EntryPlannerPut, EntryPlannerAck:
		return refuse("only the leader proposes it")
	}
	return nil
}

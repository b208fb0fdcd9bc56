package raftstore

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// EntryType is the first byte of a raft entry's data: it says what the
// entry is and how the rest is encoded. A changed encoding takes a new type
// byte, so that a replica never misreads an entry.
//
// Types with the Ignorable bit set may be skipped by a replica that does
// not know them: a newer version of kvstrata can add such entries (hints,
// statistics) before every node is upgraded. Any other unknown type panics
// the replica, because applying less than its peers would make it diverge
// silently, unless the operator lists its index (FSM.SkipEntries). An entry of a known type that does not decode never passes
// ValidateEntry; one in the log anyway is a no-op on every replica.
type EntryType byte

// The entry types. Every encoding below comes after the type byte; the
// uvarint, varint and little-endian encodings are those of encoding/binary;
// a string is a uvarint length and its bytes; a time is a varint of its
// Unix seconds and a uvarint of its nanoseconds.
const (
	// EntryEvents is a batch of directory events; see EventBatch.
	EntryEvents EntryType = 0x01
	// EntryMemberUpsert adds or replaces a member:
	//	uvarint id, string name, raft address, gRPC address,
	//	data-plane address, transport
	EntryMemberUpsert EntryType = 0x02
	// EntryMemberRemove removes a member, its liveness, its capacities and
	// every directory location of the node: uvarint id.
	EntryMemberRemove EntryType = 0x03
	// EntryLiveness marks a member up or down:
	//	uvarint id, byte up (0 or 1), time since
	// Replicas still apply it as logs written before EntryLivenessInTerm
	// hold it; a node no longer proposes it.
	EntryLiveness EntryType = 0x04
	// EntryCapacities replaces a member's tier report:
	//	uvarint id, time at, uvarint count,
	//	count × (byte tier, uvarint capacity, uvarint used, uvarint blocks)
	EntryCapacities EntryType = 0x05
	// EntryLivenessInTerm marks a member up or down as decided by the
	// leader of one raft term:
	//	uvarint term, uvarint id, byte up (0 or 1), time since
	// It is applied only when the log entry holding it has that term, so
	// that a leader's decision counts only if that leader appended it
	// itself: a deposed leader's late proposal, forwarded to or replayed by
	// a later leader, changes nothing (ErrStaleTerm).
	EntryLivenessInTerm EntryType = 0x06

	// Ignorable is the bit of an entry type that a replica which does not
	// know the type may skip.
	Ignorable EntryType = 0x80
)

var entryNames = map[EntryType]string{
	EntryEvents:         "events",
	EntryMemberUpsert:   "member-upsert",
	EntryMemberRemove:   "member-remove",
	EntryLiveness:       "liveness",
	EntryCapacities:     "capacities",
	EntryLivenessInTerm: "liveness-in-term",
	EntryWorkerUpsert:   "worker-upsert",
	EntryWorkerRemove:   "worker-remove",
	EntryWorkerExpire:   "worker-expire",
	EntryPlannerPut:     "planner-put",
	EntryPlannerAck:     "planner-ack",
}

func (t EntryType) String() string {
	if n, ok := entryNames[t]; ok {
		return n
	}
	return fmt.Sprintf("entry-type(%#02x)", byte(t))
}

// EncodeMemberUpsert returns the data of an entry that adds or replaces m.
func EncodeMemberUpsert(m Member) []byte {
	return appendMember([]byte{byte(EntryMemberUpsert)}, m)
}

// EncodeMemberRemove returns the data of an entry that removes member id.
func EncodeMemberRemove(id index.NodeID) []byte {
	return appendUvarint([]byte{byte(EntryMemberRemove)}, uint64(id))
}

// EncodeLiveness returns the data of an entry that marks member id up or
// down as of since, whoever appends it. Nodes propose
// EncodeLivenessInTerm instead; this is kept for tests of logs that hold
// such entries.
func EncodeLiveness(id index.NodeID, up bool, since time.Time) []byte {
	return appendLiveness([]byte{byte(EntryLiveness)}, id, Liveness{Up: up, Since: since})
}

// EncodeLivenessInTerm returns the data of an entry that marks member id
// up or down as of since, a decision of the leader of term: it is applied
// only if the entry is appended to the log in that term.
func EncodeLivenessInTerm(term uint64, id index.NodeID, up bool, since time.Time) []byte {
	return appendLiveness(appendUvarint([]byte{byte(EntryLivenessInTerm)}, term), id, Liveness{Up: up, Since: since})
}

// EncodeCapacities returns the data of an entry that replaces the tier
// report of member c.Node.
func EncodeCapacities(c Capacities) []byte {
	return appendCapacities([]byte{byte(EntryCapacities)}, c)
}

func appendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

func appendMember(dst []byte, m Member) []byte {
	dst = appendUvarint(dst, uint64(m.ID))
	for _, s := range []string{m.Name, m.RaftAddr, m.GRPCAddr, m.DataAddr, m.Transport} {
		dst = appendString(dst, s)
	}
	return dst
}

func readMember(r *reader) Member {
	return Member{
		ID:        index.NodeID(r.uint32()),
		Name:      r.string(),
		RaftAddr:  r.string(),
		GRPCAddr:  r.string(),
		DataAddr:  r.string(),
		Transport: r.string(),
	}
}

func appendLiveness(dst []byte, id index.NodeID, l Liveness) []byte {
	dst = appendUvarint(dst, uint64(id))
	up := byte(0)
	if l.Up {
		up = 1
	}
	return appendTime(append(dst, up), l.Since)
}

func readLiveness(r *reader) (index.NodeID, Liveness) {
	id := index.NodeID(r.uint32())
	var l Liveness
	switch r.byte() {
	case 0:
	case 1:
		l.Up = true
	default:
		r.fail("up flag")
	}
	l.Since = r.time()
	return id, l
}

func appendCapacities(dst []byte, c Capacities) []byte {
	dst = appendUvarint(dst, uint64(c.Node))
	dst = appendTime(dst, c.At)
	dst = appendUvarint(dst, uint64(len(c.Tiers)))
	for _, t := range c.Tiers {
		dst = append(dst, byte(t.Tier))
		dst = appendUvarint(dst, t.Capacity)
		dst = appendUvarint(dst, t.Used)
		dst = appendUvarint(dst, t.Blocks)
	}
	return dst
}

func readCapacities(r *reader) Capacities {
	c := Capacities{Node: index.NodeID(r.uint32()), At: r.time()}
	n := r.count()
	if n > 0 {
		c.Tiers = make([]TierUsage, n)
	}
	for i := range c.Tiers {
		c.Tiers[i] = TierUsage{
			Tier:     index.TierKind(r.byte()),
			Capacity: r.uvarint(),
			Used:     r.uvarint(),
			Blocks:   r.uvarint(),
		}
	}
	return c
}

// decodeEntry decodes the data of a cluster-state entry of type t (the
// first byte of data) with read, which returns what it decoded. An error
// wraps ErrBadEntry.
func decodeEntry[T any](data []byte, read func(*reader) T) (T, error) {
	r := reader{b: data[1:]}
	v := read(&r)
	if err := r.done(); err != nil {
		var zero T
		return zero, fmt.Errorf("%w: %v entry: %w", ErrBadEntry, EntryType(data[0]), err)
	}
	return v, nil
}

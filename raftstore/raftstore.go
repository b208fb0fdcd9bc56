// Package raftstore is the storage and the state machine of kvstrata's
// Raft-replicated global block directory.
//
//   - LogStore keeps raft's log and stable values in Pebble (raft.LogStore
//     and raft.StableStore); the daemon wraps it in raft.NewLogCache.
//   - FSM is the replicated state: an index.Directory of every node's
//     blocks and the cluster state (members, liveness, tier capacities).
//     Entries are dispatched on their first byte, an EntryType.
//   - EventBatch encodes many directory events into one entry; Batcher
//     collects a node's events and proposes them in pipelined batches.
//
// The directory is a cache of what the nodes hold, fed by their events:
// it may be briefly stale, and a stale location costs a failed fetch,
// never wrong bytes. Membership, liveness and capacities are linearizable
// raft state. Reads (FSM.Lookup, FSM.Members, …) are served by the local
// replica, with no lock on the hot path.
//
// Transport, bootstrap and join, forwarding proposals to the leader and
// liveness monitoring belong to the daemon's wiring; RaftPropose is the
// ProposeFunc for a node that is the leader.
package raftstore

import "errors"

// Errors callers test with errors.Is.
var (
	// ErrClosed is returned by a LogStore or Batcher used after Close.
	ErrClosed = errors.New("raftstore: closed")
	// ErrCorrupt marks data that fails its checks: a stored log entry or
	// stable value, a snapshot.
	ErrCorrupt = errors.New("raftstore: corrupt data")
	// ErrKeyNotFound is LogStore.Get's error for a missing key. Its text
	// is exactly "not found" because raft recognizes a missing key by
	// that text (raft.go compares err.Error() with "not found").
	ErrKeyNotFound = errors.New("not found")
	// ErrUnknownMember is an Apply result: the entry names a node that is
	// not a member.
	ErrUnknownMember = errors.New("raftstore: unknown member")
	// ErrInvalidMember is an Apply result: a member upsert that cannot be
	// applied (node id 0, which stands for cluster-wide storage).
	ErrInvalidMember = errors.New("raftstore: invalid member")
	// ErrStaleTerm is an Apply result: a liveness decision of an earlier
	// leader, appended in a later term, which changes nothing.
	ErrStaleTerm = errors.New("raftstore: decided in an earlier term")
	// ErrUnknownEntry marks the panic of a replica that is handed an
	// entry type it does not know and may not ignore, and the Apply
	// result of such an entry skipped as FSM.SkipEntries lists it.
	ErrUnknownEntry = errors.New("raftstore: unknown entry type")
	// ErrBadEntry marks an entry of a known type that does not decode.
	// ValidateEntry keeps such entries out of the log; one that is in a
	// log anyway is applied as a no-op on every replica (see FSM).
	ErrBadEntry = errors.New("raftstore: undecodable entry")
	// ErrInvalidEntry marks an entry that may not be proposed: it does not
	// decode, its type is unknown, or what it says is impossible (node id
	// 0 where a member is meant, an unknown tier). See ValidateEntry.
	ErrInvalidEntry = errors.New("raftstore: invalid entry")
	// ErrNotForwardable marks a valid entry that a member may not forward
	// to the leader: see CheckForwarded.
	ErrNotForwardable = errors.New("raftstore: entry not accepted from another node")
)

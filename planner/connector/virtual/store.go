// Package virtual carries out a planner's decisions by writing them down
// for an outside system: each pool's latest decision is a Record in a
// Store, and the outside system acknowledges it with the replicas it runs.
//
// The Store is the cache cluster's replicated state (Cluster, over the Go
// client) or memory (Memory, for the simulation and tests). The Connector
// turns a planner's Scale into a new record and its Replicas into the
// acknowledged counts, in the handshake Dynamo calls scaled_decision_id:
// a pool's next change waits until its last one is acknowledged, or until
// Config.AckTimeout has passed.
package virtual

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/kvstrata/kvstrata/planner"
)

// Errors a Store returns; Cluster maps the server's InvalidArgument and
// FailedPrecondition codes onto them.
var (
	// ErrInvalid marks a decision or an ack that is malformed: an unknown
	// pool, a negative count, a zero sequence number, oversized text.
	ErrInvalid = errors.New("virtual: invalid decision")
	// ErrStale marks a decision older than the pool's record, or an ack
	// of a sequence number the pool has not reached or already passed.
	ErrStale = errors.New("virtual: stale sequence number")
)

// Record is a pool's latest decision and its acknowledgement: AckSeq is
// the last decision the outside system carried out and AckReplicas the
// replicas it said it runs. AckSeq 0 is not acknowledged yet.
type Record struct {
	planner.Decision
	AckSeq      uint64
	AckReplicas int
}

// Pending is whether the record's decision waits for its ack. An advisory
// decision (Publish's, Mode planner.ModeAdvisory) asks nothing of anyone:
// it never waits.
func (r Record) Pending() bool { return r.AckSeq < r.Seq && r.Mode != planner.ModeAdvisory }

// Store keeps each pool's latest Record.
type Store interface {
	// Put makes each decision its pool's record. A decision's Seq must be
	// at least 1 and at least the pool's current Seq (ErrStale otherwise;
	// an equal Seq replaces the record, so a retried Put is harmless).
	// The acknowledgement fields carry over. All or nothing.
	Put(ctx context.Context, ds []planner.Decision) error
	// Latest is every pool's record, in pool order.
	Latest(ctx context.Context) ([]Record, error)
	// Ack says pool runs replicas after carrying out decision seq, which
	// must lie between the pool's AckSeq and Seq (ErrStale otherwise).
	Ack(ctx context.Context, pool planner.Pool, seq uint64, replicas int) error
}

// Limits on what a Store accepts; the cluster's replicated state enforces
// the same.
const (
	// MaxRecords is the most pools a store holds.
	MaxRecords = 64
	// MaxField is the longest pool, reason or mode, in bytes.
	MaxField = 256
)

// ValidPool is whether p is one of the planner's pools.
func ValidPool(p planner.Pool) bool {
	return p == planner.Prefill || p == planner.Decode || p == planner.Aggregated
}

// Validate says what is wrong with d, wrapping ErrInvalid.
func Validate(d planner.Decision) error {
	switch {
	case !ValidPool(d.Pool):
		return fmt.Errorf("%w: unknown pool %q (want prefill, decode or aggregated)", ErrInvalid, d.Pool)
	case d.Seq == 0:
		return fmt.Errorf("%w: pool %s: sequence number 0 (they start at 1)", ErrInvalid, d.Pool)
	case d.Target < 0 || d.Current < 0:
		return fmt.Errorf("%w: pool %s: negative replicas (target %d, current %d)", ErrInvalid, d.Pool, d.Target, d.Current)
	case len(d.Reason) > MaxField || len(d.Mode) > MaxField:
		return fmt.Errorf("%w: pool %s: reason or mode longer than %d bytes", ErrInvalid, d.Pool, MaxField)
	}
	return nil
}

// ValidateAck says what is wrong with an ack's arguments, wrapping
// ErrInvalid.
func ValidateAck(pool planner.Pool, seq uint64, replicas int) error {
	switch {
	case !ValidPool(pool):
		return fmt.Errorf("%w: unknown pool %q (want prefill, decode or aggregated)", ErrInvalid, pool)
	case seq == 0:
		return fmt.Errorf("%w: pool %s: ack of sequence number 0", ErrInvalid, pool)
	case replicas < 0:
		return fmt.Errorf("%w: pool %s: negative replicas %d", ErrInvalid, pool, replicas)
	}
	return nil
}

// Memory is a Store in memory, safe for concurrent use.
type Memory struct {
	mu   sync.Mutex
	recs map[planner.Pool]Record
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory() *Memory { return &Memory{recs: map[planner.Pool]Record{}} }

// Put implements Store.
func (m *Memory) Put(_ context.Context, ds []planner.Decision) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := make(map[planner.Pool]Record, len(ds))
	for _, d := range ds {
		if err := Validate(d); err != nil {
			return err
		}
		r, ok := next[d.Pool]
		if !ok {
			r, ok = m.recs[d.Pool]
		}
		if ok && d.Seq < r.Seq {
			return fmt.Errorf("%w: pool %s: decision %d is older than %d", ErrStale, d.Pool, d.Seq, r.Seq)
		}
		if !ok && len(m.recs)+len(next) >= MaxRecords {
			return fmt.Errorf("%w: more than %d pools", ErrInvalid, MaxRecords)
		}
		r.Decision = d
		next[d.Pool] = r
	}
	for p, r := range next {
		m.recs[p] = r
	}
	return nil
}

// Latest implements Store.
func (m *Memory) Latest(context.Context) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out, nil
}

// Ack implements Store.
func (m *Memory) Ack(_ context.Context, pool planner.Pool, seq uint64, replicas int) error {
	if err := ValidateAck(pool, seq, replicas); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[pool]
	if !ok {
		return fmt.Errorf("%w: pool %s has no decision to ack", ErrStale, pool)
	}
	if seq > r.Seq || seq < r.AckSeq {
		return fmt.Errorf("%w: pool %s: ack of %d outside [%d, %d]", ErrStale, pool, seq, r.AckSeq, r.Seq)
	}
	r.AckSeq, r.AckReplicas = seq, replicas
	m.recs[pool] = r
	return nil
}

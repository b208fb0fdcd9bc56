package raftstore

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// This file holds the planner's records: each worker pool's latest scaling
// decision, written by a planner whose connector is "virtual", and the
// acknowledgement of the outside system that carries it out. They are
// replicated like the worker registry, so that every node serves the same
// records and a leader change loses none.
//
// A pool's record moves forward only: a decision replaces it if its
// sequence number is at least the record's (an equal one is a retry), and
// an ack names a sequence number between the last ack and the decision.
// Both rules are checked when the entry is applied, on every replica
// alike, so a stale write changes nothing anywhere (ErrPlannerStale).

// Bounds of the planner records, checked before an entry reaches the log
// (ValidateEntry).
const (
	// MaxPlannerRecords bounds the decisions of one EntryPlannerPut, and
	// the records held.
	MaxPlannerRecords = 64
	// MaxPlannerReplicas bounds a record's replica counts.
	MaxPlannerReplicas = 1 << 20
)

// ErrPlannerStale is an Apply result: a decision older than its pool's
// record, or an ack of a sequence number the record has not reached or
// already passed.
var ErrPlannerStale = errors.New("raftstore: stale planner sequence number")

// PlannerRecord is a pool's latest decision and its acknowledgement.
type PlannerRecord struct {
	// Planner names the planner that decided; informational.
	Planner string
	// Pool is aggregated, prefill or decode: the record's key.
	Pool string
	// Seq numbers the pool's decisions, from 1.
	Seq uint64
	// Current and Target are the replicas before and after the decision.
	Current, Target uint32
	// Need is the fractional workers the planner's model asked for.
	Need float64
	// Reason and Mode are the planner's (load, idle, manual, …; active or
	// advisory).
	Reason, Mode string
	// Applied is whether the planner asked its connector to scale.
	Applied bool
	// At is when the planner decided, by its clock.
	At time.Time
	// AckSeq is the last decision the outside system carried out (0:
	// none yet), and AckReplicas the replicas it said it runs.
	AckSeq      uint64
	AckReplicas uint32
}

// Entry types of the planner records; ignorable, as the registry's.
const (
	// EntryPlannerPut makes each decision its pool's record:
	//	uvarint count, count × (string planner, pool, uvarint seq,
	//	uvarint current, uvarint target, u64 need (IEEE 754 bits),
	//	string reason, mode, byte applied, time at)
	EntryPlannerPut EntryType = Ignorable | 0x04
	// EntryPlannerAck acknowledges a pool's decision:
	//	string pool, uvarint seq, uvarint replicas
	EntryPlannerAck EntryType = Ignorable | 0x05
)

// PlannerAck is the content of an EntryPlannerAck.
type PlannerAck struct {
	Pool     string
	Seq      uint64
	Replicas uint32
}

// EncodePlannerPut returns the data of an entry that records decisions.
func EncodePlannerPut(recs []PlannerRecord) []byte {
	dst := appendUvarint([]byte{byte(EntryPlannerPut)}, uint64(len(recs)))
	for _, p := range recs {
		dst = appendPlannerDecision(dst, p)
	}
	return dst
}

// EncodePlannerAck returns the data of an entry that acknowledges a's
// decision.
func EncodePlannerAck(a PlannerAck) []byte {
	dst := appendString([]byte{byte(EntryPlannerAck)}, a.Pool)
	dst = appendUvarint(dst, a.Seq)
	return appendUvarint(dst, uint64(a.Replicas))
}

func appendPlannerDecision(dst []byte, p PlannerRecord) []byte {
	dst = appendString(dst, p.Planner)
	dst = appendString(dst, p.Pool)
	dst = appendUvarint(dst, p.Seq)
	dst = appendUvarint(dst, uint64(p.Current))
	dst = appendUvarint(dst, uint64(p.Target))
	dst = appendU64(dst, math.Float64bits(p.Need))
	dst = appendString(dst, p.Reason)
	dst = appendString(dst, p.Mode)
	applied := byte(0)
	if p.Applied {
		applied = 1
	}
	dst = append(dst, applied)
	return appendTime(dst, p.At)
}

func readPlannerDecision(r *reader) PlannerRecord {
	p := PlannerRecord{Planner: r.string(), Pool: r.string(), Seq: r.uvarint(), Current: r.uint32(), Target: r.uint32(),
		Need: math.Float64frombits(r.u64()), Reason: r.string(), Mode: r.string()}
	switch r.byte() {
	case 0:
	case 1:
		p.Applied = true
	default:
		r.fail("applied flag")
	}
	p.At = r.time()
	return p
}

func readPlannerPut(r *reader) []PlannerRecord {
	n := r.count()
	if n > MaxPlannerRecords {
		r.fail(fmt.Sprintf("count (%d decisions, at most %d)", n, MaxPlannerRecords))
		return nil
	}
	recs := make([]PlannerRecord, n)
	for i := range recs {
		recs[i] = readPlannerDecision(r)
	}
	return recs
}

func readPlannerAck(r *reader) PlannerAck {
	return PlannerAck{Pool: r.string(), Seq: r.uvarint(), Replicas: r.uint32()}
}

func knownPool(p string) bool { return p == "aggregated" || p == "prefill" || p == "decode" }

// CheckPlannerDecisions reports what is wrong with decisions a caller
// wants recorded: none or more than MaxPlannerRecords, a pool not
// aggregated, prefill or decode, or named twice, a sequence number 0,
// replicas over MaxPlannerReplicas, a need not a finite number ≥ 0, a
// text field over MaxWorkerField. ValidateEntry checks the same.
func CheckPlannerDecisions(recs []PlannerRecord) error {
	if len(recs) == 0 || len(recs) > MaxPlannerRecords {
		return fmt.Errorf("planner decisions: %d, not 1 to %d", len(recs), MaxPlannerRecords)
	}
	var probs []string
	seen := map[string]bool{}
	for _, p := range recs {
		if !knownPool(p.Pool) {
			probs = append(probs, fmt.Sprintf("pool %.64q is not aggregated, prefill or decode", p.Pool))
			continue
		}
		if seen[p.Pool] {
			probs = append(probs, fmt.Sprintf("pool %s named twice", p.Pool))
		}
		seen[p.Pool] = true
		if p.Seq == 0 {
			probs = append(probs, fmt.Sprintf("pool %s: sequence number 0 (they start at 1)", p.Pool))
		}
		if p.Current > MaxPlannerReplicas || p.Target > MaxPlannerReplicas {
			probs = append(probs, fmt.Sprintf("pool %s: replicas %d → %d, over %d", p.Pool, p.Current, p.Target, MaxPlannerReplicas))
		}
		if math.IsNaN(p.Need) || math.IsInf(p.Need, 0) || p.Need < 0 {
			probs = append(probs, fmt.Sprintf("pool %s: need %v is not a number ≥ 0", p.Pool, p.Need))
		}
		for name, s := range map[string]string{"planner": p.Planner, "reason": p.Reason, "mode": p.Mode} {
			if len(s) > MaxWorkerField {
				probs = append(probs, fmt.Sprintf("pool %s: the %s is %d bytes, over %d", p.Pool, name, len(s), MaxWorkerField))
			}
		}
	}
	if len(probs) == 0 {
		return nil
	}
	slices.Sort(probs)
	return fmt.Errorf("planner decisions: %s", strings.Join(probs, "; "))
}

// CheckPlannerAck reports what is wrong with an ack: a pool not
// aggregated, prefill or decode, a sequence number 0, replicas over
// MaxPlannerReplicas.
func CheckPlannerAck(a PlannerAck) error {
	switch {
	case !knownPool(a.Pool):
		return fmt.Errorf("planner ack: pool %.64q is not aggregated, prefill or decode", a.Pool)
	case a.Seq == 0:
		return fmt.Errorf("planner ack: pool %s: sequence number 0", a.Pool)
	case a.Replicas > MaxPlannerReplicas:
		return fmt.Errorf("planner ack: pool %s: %d replicas, over %d", a.Pool, a.Replicas, MaxPlannerReplicas)
	}
	return nil
}

// plannerRecords is the FSM's records by pool; a value is never changed
// once published.
type plannerRecords struct {
	pools map[string]PlannerRecord
}

var emptyPlannerRecords = &plannerRecords{pools: map[string]PlannerRecord{}}

// put records every decision or, if one is stale, none.
func (g *plannerRecords) put(recs []PlannerRecord) (*plannerRecords, error) {
	n := &plannerRecords{pools: maps.Clone(g.pools)}
	for _, p := range recs {
		old, ok := n.pools[p.Pool]
		if ok && p.Seq < old.Seq {
			return g, fmt.Errorf("pool %s: decision %d is older than %d: %w", p.Pool, p.Seq, old.Seq, ErrPlannerStale)
		}
		if !ok && len(n.pools) >= MaxPlannerRecords {
			return g, fmt.Errorf("pool %s: %d records held, the most: %w", p.Pool, MaxPlannerRecords, ErrPlannerStale)
		}
		p.AckSeq, p.AckReplicas = old.AckSeq, old.AckReplicas
		n.pools[p.Pool] = p
	}
	return n, nil
}

func (g *plannerRecords) ack(a PlannerAck) (*plannerRecords, error) {
	p, ok := g.pools[a.Pool]
	if !ok {
		return g, fmt.Errorf("pool %s has no decision to acknowledge: %w", a.Pool, ErrPlannerStale)
	}
	if a.Seq > p.Seq || a.Seq < p.AckSeq {
		return g, fmt.Errorf("pool %s: ack of decision %d, outside %d to %d: %w", a.Pool, a.Seq, p.AckSeq, p.Seq, ErrPlannerStale)
	}
	n := &plannerRecords{pools: maps.Clone(g.pools)}
	p.AckSeq, p.AckReplicas = a.Seq, a.Replicas
	n.pools[a.Pool] = p
	return n, nil
}

func (g *plannerRecords) sorted() []PlannerRecord {
	out := slices.Collect(maps.Values(g.pools))
	slices.SortFunc(out, func(a, b PlannerRecord) int { return strings.Compare(a.Pool, b.Pool) })
	return out
}

// appendPlannerRecords appends the snapshot encoding of g: a count and the
// records by pool, each as in EntryPlannerPut followed by uvarint ack seq
// and uvarint ack replicas.
func appendPlannerRecords(dst []byte, g *plannerRecords) []byte {
	dst = appendUvarint(dst, uint64(len(g.pools)))
	for _, p := range g.sorted() {
		dst = appendPlannerDecision(dst, p)
		dst = appendUvarint(dst, p.AckSeq)
		dst = appendUvarint(dst, uint64(p.AckReplicas))
	}
	return dst
}

func readPlannerRecords(r *reader) *plannerRecords {
	g := &plannerRecords{pools: map[string]PlannerRecord{}}
	for n := r.count(); n > 0; n-- {
		p := readPlannerDecision(r)
		p.AckSeq, p.AckReplicas = r.uvarint(), r.uint32()
		g.pools[p.Pool] = p
	}
	return g
}

// PlannerRecords returns every pool's record, by pool, from the local
// replica.
func (f *FSM) PlannerRecords() []PlannerRecord { return f.plannerRecs().sorted() }

// PlannerRecord returns pool's record.
func (f *FSM) PlannerRecord(pool string) (PlannerRecord, bool) {
	p, ok := f.plannerRecs().pools[pool]
	return p, ok
}

func (f *FSM) plannerRecs() *plannerRecords {
	if g := f.planner.Load(); g != nil {
		return g
	}
	return emptyPlannerRecords
}

// applyPlanner applies a planner entry; the result is as applyEntry's.
func (f *FSM) applyPlanner(e decoded) error {
	g := f.plannerRecs()
	var err error
	switch e.typ {
	case EntryPlannerPut:
		g, err = g.put(e.plannerPut)
	case EntryPlannerAck:
		g, err = g.ack(e.plannerAck)
	}
	if err != nil {
		return err
	}
	f.planner.Store(g)
	return nil
}

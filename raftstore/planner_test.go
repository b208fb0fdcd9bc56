package raftstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/raftstore"
)

func decision(pool string, seq uint64, current, target uint32) raftstore.PlannerRecord {
	return raftstore.PlannerRecord{Planner: "planner-0", Pool: pool, Seq: seq, Current: current, Target: target,
		Need: float64(target) - 0.3, Reason: "load", Mode: "active", Applied: true, At: t0}
}

func records(f *raftstore.FSM) string { return fmt.Sprint(f.PlannerRecords()) }

func TestFSMPlannerRecordsMoveForwardOnly(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("prefill", 1, 1, 2), decision("decode", 1, 1, 3)}))
	a.ok(raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "prefill", Seq: 1, Replicas: 2}))
	got, ok := a.f.PlannerRecord("prefill")
	want := decision("prefill", 1, 1, 2)
	want.AckSeq, want.AckReplicas = 1, 2
	if !ok || got != want {
		t.Fatalf("prefill record %+v, want %+v", got, want)
	}
	// A new decision keeps the ack until the outside system acks it.
	a.ok(raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("prefill", 2, 2, 4)}))
	if got, _ := a.f.PlannerRecord("prefill"); got.Seq != 2 || got.Target != 4 || got.AckSeq != 1 || got.AckReplicas != 2 {
		t.Fatalf("after decision 2: %+v", got)
	}
	// A retry of the same decision is harmless.
	a.ok(raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("prefill", 2, 2, 4)}))

	before := records(a.f)
	stale := [][]byte{
		// Older than the record; with a good decision of another pool: all or nothing.
		raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("decode", 2, 3, 5), decision("prefill", 1, 1, 9)}),
		raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "prefill", Seq: 3, Replicas: 4}),    // not decided yet
		raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "aggregated", Seq: 1, Replicas: 1}), // no record
	}
	for _, data := range stale {
		res := a.apply(data)
		if err, _ := res.(error); !errors.Is(err, raftstore.ErrPlannerStale) {
			t.Errorf("%v entry: result %v, want ErrPlannerStale", raftstore.EntryType(data[0]), res)
		}
	}
	a.ok(raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "prefill", Seq: 2, Replicas: 4}))
	if res := a.apply(raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "prefill", Seq: 1, Replicas: 1})); res == nil {
		t.Error("an ack older than the last one was applied")
	}
	if got, _ := a.f.PlannerRecord("decode"); got != decision("decode", 1, 1, 3) {
		t.Fatalf("a refused put changed decode: %+v (records before: %s)", got, before)
	}
}

func TestValidateEntryRefusesBadPlannerRecords(t *testing.T) {
	huge := strings.Repeat("x", raftstore.MaxWorkerField+1)
	with := func(change func(*raftstore.PlannerRecord)) []raftstore.PlannerRecord {
		d := decision("decode", 1, 1, 2)
		change(&d)
		return []raftstore.PlannerRecord{d}
	}
	many := make([]raftstore.PlannerRecord, raftstore.MaxPlannerRecords+1)
	for i := range many {
		many[i] = decision("decode", uint64(i+1), 1, 2)
	}
	bad := map[string][]raftstore.PlannerRecord{
		"none":          nil,
		"too many":      many,
		"unknown pool":  with(func(d *raftstore.PlannerRecord) { d.Pool = "gpu" }),
		"seq 0":         with(func(d *raftstore.PlannerRecord) { d.Seq = 0 }),
		"huge target":   with(func(d *raftstore.PlannerRecord) { d.Target = raftstore.MaxPlannerReplicas + 1 }),
		"NaN need":      with(func(d *raftstore.PlannerRecord) { d.Need = math.NaN() }),
		"negative need": with(func(d *raftstore.PlannerRecord) { d.Need = -1 }),
		"huge reason":   with(func(d *raftstore.PlannerRecord) { d.Reason = huge }),
		"huge planner":  with(func(d *raftstore.PlannerRecord) { d.Planner = huge }),
		"pool twice":    {decision("decode", 1, 1, 2), decision("decode", 2, 1, 2)},
	}
	for name, recs := range bad {
		if err := raftstore.ValidateEntry(raftstore.EncodePlannerPut(recs)); !errors.Is(err, raftstore.ErrInvalidEntry) {
			t.Errorf("%s: ValidateEntry = %v, want ErrInvalidEntry", name, err)
		}
		if err := raftstore.CheckPlannerDecisions(recs); err == nil {
			t.Errorf("%s: CheckPlannerDecisions = nil", name)
		}
	}
	for name, a := range map[string]raftstore.PlannerAck{
		"unknown pool": {Pool: "gpu", Seq: 1}, "seq 0": {Pool: "decode"}, "huge": {Pool: "decode", Seq: 1, Replicas: raftstore.MaxPlannerReplicas + 1},
	} {
		if err := raftstore.ValidateEntry(raftstore.EncodePlannerAck(a)); !errors.Is(err, raftstore.ErrInvalidEntry) {
			t.Errorf("ack, %s: ValidateEntry = %v, want ErrInvalidEntry", name, err)
		}
	}
	good := raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("decode", 1, 1, 2)})
	for _, data := range [][]byte{good, raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "decode", Seq: 1, Replicas: 2})} {
		if err := raftstore.ValidateEntry(data); err != nil {
			t.Errorf("%v entry: ValidateEntry = %v", raftstore.EntryType(data[0]), err)
		}
		// The leader proposes them for the planner: no member forwards them.
		if err := raftstore.CheckForwarded(data, 1); !errors.Is(err, raftstore.ErrNotForwardable) {
			t.Errorf("%v entry forwarded by node 1: %v, want ErrNotForwardable", raftstore.EntryType(data[0]), err)
		}
	}
	if err := raftstore.ValidateEntry(good[:len(good)-2]); !errors.Is(err, raftstore.ErrBadEntry) {
		t.Errorf("a truncated planner put: ValidateEntry = %v, want ErrBadEntry", err)
	}
	// The entry types are ignorable, so an older replica skips them.
	if raftstore.EntryPlannerPut&raftstore.Ignorable == 0 || raftstore.EntryPlannerAck&raftstore.Ignorable == 0 {
		t.Error("planner entries are not ignorable")
	}
}

func TestSnapshotKeepsThePlannerRecords(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	a.ok(raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("aggregated", 3, 2, 5)}))
	a.ok(raftstore.EncodePlannerAck(raftstore.PlannerAck{Pool: "aggregated", Seq: 3, Replicas: 5}))
	snap, _ := a.f.Snapshot()
	a.ok(raftstore.EncodePlannerPut([]raftstore.PlannerRecord{decision("aggregated", 4, 5, 1)})) // after: not in it
	b := persist(t, snap).Bytes()
	if b[8] != 3 {
		t.Fatalf("a snapshot with planner records is of format %d, want 3", b[8])
	}
	f := raftstore.NewFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	want := decision("aggregated", 3, 2, 5)
	want.AckSeq, want.AckReplicas = 3, 5
	if got := f.PlannerRecords(); len(got) != 1 || got[0] != want {
		t.Fatalf("restored records %+v, want %+v", got, want)
	}
	// With workers too, both come back.
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0.Add(60e9))))
	snap, _ = a.f.Snapshot()
	if err := f.Restore(io.NopCloser(bytes.NewReader(persist(t, snap).Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if len(f.Workers(t0)) != 1 || records(f) != records(a.f) {
		t.Fatalf("restored %d workers and records %s, want 1 and %s", len(f.Workers(t0)), records(f), records(a.f))
	}
	// A damaged planner frame is refused and changes nothing.
	bad := persist(t, snap).Bytes()
	i := bytes.IndexByte(bad[9:], 'P') + 9
	bad[i+3] ^= 0xff
	if err := f.Restore(io.NopCloser(bytes.NewReader(bad))); !errors.Is(err, raftstore.ErrCorrupt) {
		t.Fatalf("Restore of a damaged snapshot: %v, want ErrCorrupt", err)
	}
	if records(f) != records(a.f) {
		t.Fatal("a refused restore changed the records")
	}
}

package raftstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	failAfter         int // fail writes once this many bytes were written; 0: never
	closed, cancelled bool
}

func (s *memSink) ID() string { return "mem" }

func (s *memSink) Write(p []byte) (int, error) {
	if s.failAfter > 0 && s.Len()+len(p) > s.failAfter {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}

func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

// busyFSM returns an FSM with tens of thousands of blocks (many snapshot
// frames), entries with several locations, and every kind of cluster state.
func busyFSM(t testing.TB) *applier {
	a := newApplier(t)
	for id := index.NodeID(1); id <= 3; id++ {
		a.ok(raftstore.EncodeMemberUpsert(member(id)))
		a.ok(raftstore.EncodeCapacities(raftstore.Capacities{Node: id, At: t0, Tiers: []raftstore.TierUsage{
			{Tier: index.TierDRAM, Capacity: uint64(id) << 30, Used: uint64(id) << 20, Blocks: uint64(id)},
		}}))
	}
	a.ok(raftstore.EncodeLiveness(2, false, t0))
	a.ok(raftstore.EncodeLiveness(3, true, t0))
	for seed := range uint64(30) {
		a.ok(encode(chainEvents(seed, 1000, index.Location{Node: index.NodeID(1 + seed%3), Tier: index.TierDRAM})))
	}
	a.ok(encode(chainEvents(1, 500, s3)))
	a.ok(encode(chainEvents(2, 500, n2SSD)))
	a.ok(encode(randomEventsSeed(11, 3000)))
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0)))
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(2, t0.Add(time.Minute))))
	return a
}

// fsmState is everything an FSM holds, as text to compare.
func fsmState(f *raftstore.FSM) string {
	return fmt.Sprintf("%s\n%+v\n%+v\napplied %d", dumpDir(f.Directory()), f.Roster(), f.Workers(time.Time{}), f.AppliedIndex())
}

func persist(t testing.TB, snap raft.FSMSnapshot) *memSink {
	t.Helper()
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatalf("Persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("Persist left the sink closed=%v cancelled=%v", sink.closed, sink.cancelled)
	}
	snap.Release()
	return sink
}

func TestSnapshotRestoresIntoAFreshFSM(t *testing.T) {
	a := busyFSM(t)
	want := fsmState(a.f)
	snap, err := a.f.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	// Raft goes on applying while Persist writes: the snapshot must not
	// see those entries.
	var sink *memSink
	var wg sync.WaitGroup
	wg.Go(func() { sink = persist(t, snap) })
	a.ok(encode(chainEvents(99, 2000, n1DRAM)))
	a.ok(encode([]raftstore.Event{{Kind: raftstore.EventNodeDropped, Loc: index.Location{Node: 3}}}))
	a.ok(raftstore.EncodeMemberRemove(1))
	a.ok(raftstore.EncodeLiveness(2, true, t0))
	wg.Wait()

	fresh := raftstore.NewFSM()
	old := fresh.Directory()
	if err := fresh.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got := fsmState(fresh); got != want {
		t.Fatalf("restored state differs from the state at the snapshot (%d vs %d bytes of dump)", len(got), len(want))
	}
	if old.Len() != 0 || fresh.Directory() == old {
		t.Fatal("Restore changed the old directory instead of swapping in a new one")
	}
	if fresh.Alive(2) {
		t.Fatal("liveness was not restored: node 2 is down in the snapshot")
	}
}

func TestSnapshotOfAnEmptyFSMRestores(t *testing.T) {
	snap, _ := raftstore.NewFSM().Snapshot()
	sink := persist(t, snap)
	a := busyFSM(t)
	if err := a.f.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got, want := fsmState(a.f), fsmState(raftstore.NewFSM()); got != want {
		t.Fatalf("restoring an empty snapshot left %q", got)
	}
}

func TestRestoreRejectsDamagedSnapshotsAndKeepsItsState(t *testing.T) {
	a := busyFSM(t)
	snap, _ := a.f.Snapshot()
	good := persist(t, snap).Bytes()
	target := newApplier(t)
	target.ok(encode(chainEvents(5, 10, n1DRAM)))
	before := fsmState(target.f)
	cases := map[string][]byte{
		"empty":           nil,
		"bad magic":       append([]byte("XVSTRDIR"), good[8:]...),
		"newer version":   append(append([]byte("KVSTRDIR"), 3), good[9:]...),
		"version 1, a W":  append(append([]byte("KVSTRDIR"), 1), good[9:]...),
		"no end frame":    good[:len(good)-8],
		"one byte short":  good[:len(good)-1],
		"trailing byte":   append(bytes.Clone(good), 0),
		"header only":     good[:9],
		"truncated frame": good[:len(good)/2],
	}
	for _, off := range []int{9, 12, 100, len(good) / 3, len(good) - 3} {
		b := bytes.Clone(good)
		b[off] ^= 0x40
		cases[fmt.Sprintf("byte %d flipped", off)] = b
	}
	for name, data := range cases {
		err := target.f.Restore(io.NopCloser(bytes.NewReader(data)))
		if !errors.Is(err, raftstore.ErrCorrupt) {
			t.Errorf("%s: Restore = %v, want ErrCorrupt", name, err)
		}
		if fsmState(target.f) != before {
			t.Fatalf("%s: a failed Restore changed the FSM", name)
		}
	}
}

func TestPersistCancelsTheSinkOnError(t *testing.T) {
	a := busyFSM(t)
	snap, _ := a.f.Snapshot()
	sink := &memSink{failAfter: 100 << 10}
	if err := snap.Persist(sink); err == nil || !sink.cancelled || sink.closed {
		t.Fatalf("Persist to a failing sink = %v, cancelled=%v closed=%v", err, sink.cancelled, sink.closed)
	}
}

func BenchmarkSnapshotPersistRestore(b *testing.B) {
	a := busyFSM(b)
	n := a.f.Directory().Len()
	for b.Loop() {
		snap, _ := a.f.Snapshot()
		sink := persist(b, snap)
		if err := raftstore.NewFSM().Restore(io.NopCloser(&sink.Buffer)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "entries/s")
}

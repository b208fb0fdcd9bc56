package raftstore_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

var (
	n1DRAM = index.Location{Node: 1, Tier: index.TierDRAM}
	n2SSD  = index.Location{Node: 2, Tier: index.TierSSD}
	s3     = index.Location{Node: index.AnyNode, Tier: index.TierS3}
	t0     = time.Date(2026, 5, 1, 12, 0, 0, 123, time.UTC)
)

func member(id index.NodeID) raftstore.Member {
	return raftstore.Member{
		ID: id, Name: fmt.Sprintf("node%d", id),
		RaftAddr: fmt.Sprintf("10.0.0.%d:7000", id), GRPCAddr: fmt.Sprintf("10.0.0.%d:7001", id),
		DataAddr: fmt.Sprintf("10.0.0.%d:7002", id), Transport: "tcp",
	}
}

// applier applies entries to an FSM at increasing indexes.
type applier struct {
	t   testing.TB
	f   *raftstore.FSM
	idx uint64
}

func newApplier(t testing.TB) *applier { return &applier{t: t, f: raftstore.NewFSM()} }

func (a *applier) log(data []byte) *raft.Log {
	a.idx++
	return &raft.Log{Index: a.idx, Term: 1, Type: raft.LogCommand, Data: data}
}

// apply applies data and returns the result.
func (a *applier) apply(data []byte) any { return a.f.Apply(a.log(data)) }

// ok applies data and fails the test on a non-nil result.
func (a *applier) ok(data []byte) {
	a.t.Helper()
	if res := a.apply(data); res != nil {
		a.t.Fatalf("apply %v entry: result %v", raftstore.EntryType(data[0]), res)
	}
}

// dumpDir lists a directory's entries, sorted, one a line. The locations
// of an entry are sorted too: their order is how they were added, which a
// replayed event changes, and no lookup depends on it.
func dumpDir(d *index.Directory) string {
	var lines []string
	d.Range(func(k index.Key, e index.Entry) bool {
		slices.SortFunc(e.Locations, func(a, b index.Location) int {
			return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Tier, b.Tier))
		})
		lines = append(lines, fmt.Sprintf("%v %+v %v", k, e.Meta, e.Locations))
		return true
	})
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func chainHashes(evs []raftstore.Event) []index.Hash {
	var hs []index.Hash
	for _, ev := range evs {
		hs = append(hs, ev.Key.Hash)
	}
	return hs
}

func TestFSMAppliesEventBatchesToTheDirectory(t *testing.T) {
	a := newApplier(t)
	evs := chainEvents(1, 100, n1DRAM)
	a.ok(encode(evs))
	a.ok(encode(chainEvents(1, 40, n2SSD)))
	p := a.f.Lookup(testNS, chainHashes(evs))
	if p.Blocks != 100 || p.At(n1DRAM) != 100 || p.At(n2SSD) != 40 {
		t.Fatalf("Lookup after two batches = %+v", p)
	}
	a.ok(encode([]raftstore.Event{
		{Kind: raftstore.EventRemoved, Key: evs[10].Key, Loc: n1DRAM},
		{Kind: raftstore.EventNodeDropped, Loc: index.Location{Node: 2}},
	}))
	if p := a.f.Lookup(testNS, chainHashes(evs)); p.Blocks != 10 || p.At(n2SSD) != 0 {
		t.Fatalf("Lookup after a removal and a node drop = %+v", p)
	}
	if got := a.f.Stats().Events; got != 142 {
		t.Fatalf("Stats().Events = %d, want 142", got)
	}
	if a.f.AppliedIndex() != 3 {
		t.Fatalf("AppliedIndex = %d, want 3", a.f.AppliedIndex())
	}
}

func TestFSMMembersAreUpsertedAndRemoved(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(2)))
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	m := member(2)
	m.GRPCAddr = "10.0.0.9:7001"
	a.ok(raftstore.EncodeMemberUpsert(m))
	if got := a.f.Members(); !slices.Equal(got, []raftstore.Member{member(1), m}) {
		t.Fatalf("Members = %+v", got)
	}
	// Removing a member forgets its blocks too.
	a.ok(encode(chainEvents(1, 10, n2SSD)))
	a.ok(encode(chainEvents(1, 10, s3)))
	a.ok(raftstore.EncodeMemberRemove(2))
	if _, ok := a.f.Member(2); ok {
		t.Fatal("member 2 is still there")
	}
	if p := a.f.Lookup(testNS, chainHashes(chainEvents(1, 10, s3))); p.At(n2SSD) != 0 || p.At(s3) != 10 {
		t.Fatalf("Lookup after removing node 2 = %+v", p)
	}
}

func TestFSMLookupIgnoresNodesMarkedDownButNotS3(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	a.ok(raftstore.EncodeMemberUpsert(member(2)))
	evs := chainEvents(1, 8, n1DRAM)
	a.ok(encode(evs))
	a.ok(encode(chainEvents(1, 8, n2SSD)))
	a.ok(encode(chainEvents(1, 4, s3)))
	a.ok(raftstore.EncodeLiveness(1, false, t0))
	if a.f.Alive(1) || !a.f.Alive(2) || !a.f.Alive(index.AnyNode) || !a.f.Alive(7) {
		t.Fatal("Alive: want node 1 down, node 2, AnyNode and unknown node 7 up")
	}
	if l, _ := a.f.Liveness(1); l.Up || !l.Since.Equal(t0) {
		t.Fatalf("Liveness(1) = %+v, want down since %v", l, t0)
	}
	p := a.f.Lookup(testNS, chainHashes(evs))
	if p.Blocks != 8 || p.At(n1DRAM) != 0 || p.At(n2SSD) != 8 || p.At(s3) != 4 {
		t.Fatalf("Lookup with node 1 down = %+v", p)
	}
	// The directory keeps node 1's blocks: they count again once it is up.
	a.ok(raftstore.EncodeLiveness(1, true, t0.Add(time.Minute)))
	if p := a.f.Lookup(testNS, chainHashes(evs)); p.At(n1DRAM) != 8 {
		t.Fatalf("Lookup with node 1 up again = %+v", p)
	}
}

func TestFSMRecordsCapacities(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	c := raftstore.Capacities{Node: 1, At: t0, Tiers: []raftstore.TierUsage{
		{Tier: index.TierDRAM, Capacity: 64 << 30, Used: 10 << 30, Blocks: 1000},
		{Tier: index.TierSSD, Capacity: 2 << 40, Used: 1 << 40, Blocks: 99999},
	}}
	a.ok(raftstore.EncodeCapacities(c))
	got, ok := a.f.Capacities(1)
	if !ok || !got.At.Equal(c.At) || !slices.Equal(got.Tiers, c.Tiers) {
		t.Fatalf("Capacities(1) = %+v, %v; want %+v", got, ok, c)
	}
}

func TestFSMReturnsBusinessErrorsAndChangesNothing(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	before := a.f.Roster()
	cases := []struct {
		name string
		data []byte
		want error
	}{
		{"remove unknown member", raftstore.EncodeMemberRemove(5), raftstore.ErrUnknownMember},
		{"liveness of unknown member", raftstore.EncodeLiveness(5, false, t0), raftstore.ErrUnknownMember},
		{"capacities of unknown member", raftstore.EncodeCapacities(raftstore.Capacities{Node: 5}), raftstore.ErrUnknownMember},
		{"member with node id 0", raftstore.EncodeMemberUpsert(member(0)), raftstore.ErrInvalidMember},
	}
	for _, tc := range cases {
		res := a.apply(tc.data)
		if err, ok := res.(error); !ok || !errors.Is(err, tc.want) {
			t.Errorf("%s: result %v, want %v", tc.name, res, tc.want)
		}
	}
	if after := a.f.Roster(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refused entries changed the state:\n%+v\nwant\n%+v", after, before)
	}
}

// applyPanic applies data with Apply or ApplyBatch and returns what it
// panicked with.
func applyPanic(a *applier, data []byte, batch bool) (v any) {
	defer func() { v = recover() }()
	if batch {
		a.f.ApplyBatch([]*raft.Log{a.log(encode(chainEvents(1, 3, n1DRAM))), a.log(data)})
	} else {
		a.apply(data)
	}
	return nil
}

func TestFSMPanicsOnUnknownEntryTypes(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for _, typ := range []byte{0x00, 0x3f, 0x7f} {
			v := applyPanic(newApplier(t), []byte{typ, 1, 2, 3}, batch)
			if err, ok := v.(error); !ok || !errors.Is(err, raftstore.ErrUnknownEntry) {
				t.Errorf("type %#02x (batch %v): panicked with %v, want ErrUnknownEntry", typ, batch, v)
			}
		}
	}
}

// undecodable holds entries of known types that do not decode.
func undecodable() map[string][]byte {
	upsert := raftstore.EncodeMemberUpsert(member(1))
	return map[string][]byte{
		"empty":                {},
		"truncated events":     encode(chainEvents(7, 10, n2SSD))[:30],
		"garbage events":       []byte("\x01garbage"), // 103 events in 6 bytes
		"truncated upsert":     upsert[:len(upsert)-1],
		"upsert with extra":    append(slices.Clone(upsert), 0),
		"remove without id":    {byte(raftstore.EntryMemberRemove)},
		"liveness up flag 2":   {byte(raftstore.EntryLiveness), 1, 2, 0, 0},
		"term liveness, no id": {byte(raftstore.EntryLivenessInTerm), 5},
		"capacities count":     {byte(raftstore.EntryCapacities), 1, 0, 0, 200},
	}
}

func TestFSMAppliesUndecodableEntriesAsCountedNoOps(t *testing.T) {
	for _, batch := range []bool{false, true} {
		for name, data := range undecodable() {
			a := newApplier(t)
			a.ok(raftstore.EncodeMemberUpsert(member(1)))
			before, dirBefore := fmt.Sprint(a.f.Roster()), dumpDir(a.f.Directory())
			var res any
			if batch {
				// The events around it are applied, and none of its own.
				out := a.f.ApplyBatch([]*raft.Log{a.log(encode(chainEvents(1, 3, n1DRAM))), a.log(data), a.log(encode(chainEvents(2, 3, n1DRAM)))})
				res = out[1]
				if out[0] != nil || out[2] != nil {
					t.Errorf("%s (batch): results %v around it", name, out)
				}
				if got := a.f.Directory().Len(); got != 6 {
					t.Errorf("%s (batch): the directory holds %d blocks, want the 6 of the entries around it", name, got)
				}
			} else {
				res = a.apply(data)
				if dumpDir(a.f.Directory()) != dirBefore {
					t.Errorf("%s: the directory changed", name)
				}
			}
			if err, ok := res.(error); !ok || !errors.Is(err, raftstore.ErrInvalidEntry) || !errors.Is(err, raftstore.ErrBadEntry) {
				t.Errorf("%s (batch %v): result %v, want ErrInvalidEntry and ErrBadEntry", name, batch, res)
			}
			if fmt.Sprint(a.f.Roster()) != before {
				t.Errorf("%s (batch %v): the cluster state changed", name, batch)
			}
			if st := a.f.Stats(); st.Invalid != 1 {
				t.Errorf("%s (batch %v): Stats().Invalid = %d, want 1", name, batch, st.Invalid)
			}
			if got := a.f.AppliedIndex(); got != a.idx {
				t.Errorf("%s (batch %v): AppliedIndex = %d, want %d", name, batch, got, a.idx)
			}
		}
	}
}

func TestFSMSkipsUnknownIgnorableEntries(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	before := a.f.Roster()
	if res := a.apply([]byte{byte(raftstore.Ignorable | 0x06), 0xde, 0xad}); res != nil {
		t.Fatalf("ignorable entry: result %v", res)
	}
	res := a.f.ApplyBatch([]*raft.Log{a.log([]byte{0xff}), a.log(encode(chainEvents(1, 2, n1DRAM)))})
	if res[0] != nil || res[1] != nil {
		t.Fatalf("ApplyBatch results %v", res)
	}
	if got := a.f.Stats().Skipped; got != 2 {
		t.Fatalf("Stats().Skipped = %d, want 2", got)
	}
	if fmt.Sprint(a.f.Roster()) != fmt.Sprint(before) || a.f.Directory().Len() != 2 {
		t.Fatal("skipped entries changed the state")
	}
}

func TestFSMApplyBatchEqualsApplyOneByOne(t *testing.T) {
	entries := [][]byte{
		raftstore.EncodeMemberUpsert(member(1)),
		raftstore.EncodeMemberUpsert(member(2)),
		encode(chainEvents(1, 300, n1DRAM)),
		encode(chainEvents(1, 200, n2SSD)),
		raftstore.EncodeMemberRemove(2), // must see the events before it
		encode(chainEvents(2, 50, n2SSD)),
		raftstore.EncodeMemberRemove(9),
		raftstore.EncodeLiveness(1, false, t0),
		encode(randomEventsSeed(9, 500)),
	}
	one, batched := newApplier(t), newApplier(t)
	var want []any
	var logs []*raft.Log
	for _, e := range entries {
		want = append(want, one.apply(e))
		logs = append(logs, batched.log(e))
	}
	logs = append(logs, &raft.Log{Index: 100, Type: raft.LogConfiguration, Data: []byte("not ours")})
	got := batched.f.ApplyBatch(logs)
	for i := range want {
		if fmt.Sprint(got[i]) != fmt.Sprint(want[i]) {
			t.Errorf("result %d = %v, want %v", i, got[i], want[i])
		}
	}
	if got[len(got)-1] != nil {
		t.Errorf("configuration entry result %v", got[len(got)-1])
	}
	if dumpDir(batched.f.Directory()) != dumpDir(one.f.Directory()) || fmt.Sprint(batched.f.Roster()) != fmt.Sprint(one.f.Roster()) {
		t.Fatal("ApplyBatch ended in another state than Apply one by one")
	}
	if batched.f.AppliedIndex() != 100 {
		t.Fatalf("AppliedIndex = %d, want 100", batched.f.AppliedIndex())
	}
}

func TestFSMReadersRunConcurrentlyWithApplySnapshotAndRestore(t *testing.T) {
	src := busyFSM(t)
	snap, _ := src.f.Snapshot()
	image := persist(t, snap).Bytes()
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			chain := chainHashes(chainEvents(1, 100, n1DRAM))
			for {
				select {
				case <-done:
					return
				default:
				}
				p := a.f.Lookup(testNS, chain)
				if p.Blocks > len(chain) {
					t.Errorf("Lookup found %d blocks of %d", p.Blocks, len(chain))
				}
				a.f.Members()
				a.f.Alive(1)
				a.f.Roster()
				a.f.Directory().Len()
			}
		})
	}
	for i := range 20 {
		a.ok(encode(chainEvents(uint64(i%3), 100, n1DRAM)))
		a.ok(raftstore.EncodeLiveness(1, i%2 == 0, t0))
		if s, err := a.f.Snapshot(); err == nil {
			s.Release()
		}
		if i%5 == 0 {
			if err := a.f.Restore(io.NopCloser(bytes.NewReader(image))); err != nil {
				t.Fatalf("Restore: %v", err)
			}
		}
	}
	close(done)
	wg.Wait()
}

// A liveness decision counts only in the term of the leader that made it:
// a deposed leader's proposal, appended by its successor, is a no-op on
// every replica.
func TestFSMAppliesLivenessOnlyInTheTermItWasDecided(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	stale := &raft.Log{Index: 2, Term: 3, Type: raft.LogCommand, Data: raftstore.EncodeLivenessInTerm(2, 1, false, t0)}
	for _, batch := range []bool{false, true} {
		var res any
		if batch {
			res = a.f.ApplyBatch([]*raft.Log{stale})[0]
		} else {
			res = a.f.Apply(stale)
		}
		if err, ok := res.(error); !ok || !errors.Is(err, raftstore.ErrStaleTerm) {
			t.Fatalf("batch %v: a term-2 decision appended in term 3: result %v, want ErrStaleTerm", batch, res)
		}
		if !a.f.Alive(1) {
			t.Fatalf("batch %v: node 1 marked down by a decision of an earlier term", batch)
		}
	}
	if res := a.f.Apply(&raft.Log{Index: 3, Term: 3, Type: raft.LogCommand, Data: raftstore.EncodeLivenessInTerm(3, 1, false, t0)}); res != nil {
		t.Fatalf("a decision of the entry's own term: result %v", res)
	}
	if l, _ := a.f.Liveness(1); a.f.Alive(1) || !l.Since.Equal(t0) {
		t.Fatalf("after a decision of the current term node 1 is %+v, want down since %v", l, t0)
	}
}

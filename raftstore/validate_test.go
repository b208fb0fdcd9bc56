package raftstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// validEntries returns an entry of every type that ValidateEntry accepts.
func validEntries() map[string][]byte {
	return map[string][]byte{
		"events":     encode(chainEvents(1, 5, n1DRAM)),
		"s3 events":  encode(chainEvents(2, 3, s3)),
		"no events":  encode(nil),
		"node drop":  encode([]raftstore.Event{{Kind: raftstore.EventNodeDropped, Loc: index.Location{Node: 2}}}),
		"upsert":     raftstore.EncodeMemberUpsert(member(1)),
		"remove":     raftstore.EncodeMemberRemove(2),
		"liveness":   raftstore.EncodeLiveness(2, false, t0),
		"capacities": raftstore.EncodeCapacities(raftstore.Capacities{Node: 1, At: t0, Tiers: []raftstore.TierUsage{{Tier: index.TierSSD, Capacity: 10, Used: 5, Blocks: 1}}}),
		"ignorable":  {byte(raftstore.Ignorable | 0x06), 0xde, 0xad},
	}
}

func TestValidateEntryAcceptsWhatTheNodesPropose(t *testing.T) {
	for name, data := range validEntries() {
		if err := raftstore.ValidateEntry(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestValidateEntryRefusesWhatTheFSMCannotApply(t *testing.T) {
	cases := undecodable()
	cases["unknown type"] = []byte{0x67, 'a', 'r', 'b'}
	cases["type 0"] = []byte{0x00}
	cases["upsert of node 0"] = raftstore.EncodeMemberUpsert(member(0))
	cases["upsert without addresses"] = raftstore.EncodeMemberUpsert(raftstore.Member{ID: 5, Name: "x"})
	cases["remove node 0"] = raftstore.EncodeMemberRemove(0)
	cases["liveness of node 0"] = raftstore.EncodeLiveness(0, true, t0)
	cases["capacities of node 0"] = raftstore.EncodeCapacities(raftstore.Capacities{Node: 0, At: t0})
	cases["capacities of tier 9"] = raftstore.EncodeCapacities(raftstore.Capacities{Node: 1, At: t0, Tiers: []raftstore.TierUsage{{Tier: 9}}})
	cases["event of tier 0"] = encode([]raftstore.Event{{Kind: raftstore.EventStored, Loc: index.Location{Node: 1}}})
	cases["drop of node 0"] = encode([]raftstore.Event{{Kind: raftstore.EventNodeDropped, Loc: s3}})
	for name, data := range cases {
		err := raftstore.ValidateEntry(data)
		if !errors.Is(err, raftstore.ErrInvalidEntry) {
			t.Errorf("%s: ValidateEntry = %v, want ErrInvalidEntry", name, err)
		}
	}
	// The entry: the message says what is wrong with it.
	if err := raftstore.ValidateEntry([]byte("\x01garbage")); !errors.Is(err, raftstore.ErrBadEntry) ||
		err.Error() != "raftstore: invalid entry: raftstore: undecodable entry: event batch: 103 events in 6 bytes" {
		t.Errorf("ValidateEntry(\\x01garbage) = %v", err)
	}
}

func TestCheckForwardedTakesOnlyAMembersOwnEntries(t *testing.T) {
	own := map[string][]byte{
		"own events":     encode(chainEvents(1, 5, n1DRAM)),
		"s3 events":      encode(chainEvents(2, 3, s3)),
		"own node drop":  encode([]raftstore.Event{{Kind: raftstore.EventNodeDropped, Loc: n1DRAM}}),
		"own record":     raftstore.EncodeMemberUpsert(member(1)),
		"ignorable":      {byte(raftstore.Ignorable | 0x06), 0xde, 0xad},
		"an empty batch": encode(nil),
	}
	for name, data := range own {
		if err := raftstore.CheckForwarded(data, 1); err != nil {
			t.Errorf("%s from node 1: %v", name, err)
		}
	}
	others := map[string][]byte{
		"another node's events": encode(append(chainEvents(1, 2, n1DRAM), chainEvents(2, 1, n2SSD)...)),
		"another node's drop":   encode([]raftstore.Event{{Kind: raftstore.EventNodeDropped, Loc: n2SSD}}),
		"another node's record": raftstore.EncodeMemberUpsert(member(2)),
		"a removal":             raftstore.EncodeMemberRemove(1),
		"liveness":              raftstore.EncodeLiveness(1, true, t0),
		"capacities":            raftstore.EncodeCapacities(raftstore.Capacities{Node: 1, At: t0}),
	}
	for name, data := range others {
		if err := raftstore.CheckForwarded(data, 1); !errors.Is(err, raftstore.ErrNotForwardable) {
			t.Errorf("%s from node 1: CheckForwarded = %v, want ErrNotForwardable", name, err)
		}
	}
	if err := raftstore.CheckForwarded(own["own record"], 0); !errors.Is(err, raftstore.ErrNotForwardable) {
		t.Errorf("from node 0: CheckForwarded = %v, want ErrNotForwardable", err)
	}
}

func TestRaftProposeKeepsInvalidEntriesOutOfTheLog(t *testing.T) {
	c := startCluster(t, 1, nil)
	l := c.leader()
	c.propose(raftstore.EncodeMemberUpsert(member(1)))
	last := l.raft.LastIndex()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, data := range undecodable() {
		if err := raftstore.RaftPropose(l.raft)(ctx, data); !errors.Is(err, raftstore.ErrInvalidEntry) {
			t.Errorf("%s: RaftPropose = %v, want ErrInvalidEntry", name, err)
		}
	}
	if got := l.raft.LastIndex(); got != last {
		t.Fatalf("the log grew from index %d to %d", last, got)
	}
}

// TestAClusterWhoseLogHoldsAnUndecodableEntryComesBack puts an entry that
// does not decode into the log of a 3-node cluster past the checks (as a
// build that did not validate proposals did), and restarts every node on
// its stores: each replays the entry as a no-op and the cluster commits.
func TestAClusterWhoseLogHoldsAnUndecodableEntryComesBack(t *testing.T) {
	c := startCluster(t, 3, nil)
	for id := index.NodeID(1); id <= 3; id++ {
		c.propose(raftstore.EncodeMemberUpsert(member(id)))
	}
	c.feed(0, 5)
	f := c.leader().raft.Apply([]byte("\x01garbage"), 10*time.Second)
	if err := f.Error(); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err, ok := f.Response().(error); !ok || !errors.Is(err, raftstore.ErrBadEntry) {
		t.Fatalf("the undecodable entry's result is %v, want ErrBadEntry", f.Response())
	}
	c.feed(5, 10)
	c.converge()

	// Every node down, then up again on its stores: each replays its log.
	var dirs []*testNode
	for _, nd := range c.nodes {
		c.stop(nd)
		dirs = append(dirs, nd)
	}
	for _, old := range dirs {
		c.start(c.newNode(old.dir, old.id, old.addr), nil)
	}
	c.leader()
	c.feed(10, 12)
	c.converge()
	for _, nd := range c.nodes {
		if n := nd.fsm.Directory().Len(); n != 12*100 {
			t.Errorf("%s holds %d blocks, want 1200", nd.id, n)
		}
		if got := nd.fsm.Stats().Invalid; got != 1 {
			t.Errorf("%s: Stats().Invalid = %d, want 1 (the entry replayed)", nd.id, got)
		}
	}
}

// TestAReplicaWhoseLogHoldsAnUndecodableEntryReopens does the same with
// a node's Replica, as the daemon opens it.
func TestAReplicaWhoseLogHoldsAnUndecodableEntryReopens(t *testing.T) {
	dir := t.TempDir()
	cfg := raftstore.ReplicaConfig{ID: 1, Dir: dir, Logger: quiet, HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond}
	cfg.RaftAddr = freeRaftAddr(t)
	cfg.Bootstrap = []raftstore.Peer{{ID: 1, RaftAddr: cfg.RaftAddr}}
	open := func() *raftstore.Replica {
		t.Helper()
		r, err := raftstore.OpenReplica(cfg)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the lone replica leads", r.IsLeader)
		return r
	}
	propose := func(r *raftstore.Replica, data []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return r.Propose(ctx, data)
	}
	r := open()
	if err := propose(r, raftstore.EncodeMemberUpsert(member(1))); err != nil {
		t.Fatal(err)
	}
	if err := propose(r, []byte("\x01garbage")); !errors.Is(err, raftstore.ErrInvalidEntry) {
		t.Fatalf("Propose of garbage = %v, want ErrInvalidEntry", err)
	}
	if err := r.Raft.Apply([]byte("\x01garbage"), 5*time.Second).Error(); err != nil { // past the check
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // and again, over the entry a second time
		r = open()
		if err := propose(r, raftstore.EncodeMemberUpsert(member(1))); err != nil {
			t.Fatalf("after a restart: %v", err)
		}
		if st := r.FSM.Stats(); st.Invalid != 1 {
			t.Errorf("after a restart: Stats().Invalid = %d, want 1", st.Invalid)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// freeRaftAddr returns a loopback address that was free a moment ago.
func freeRaftAddr(t *testing.T) string {
	t.Helper()
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	return string(tr.LocalAddr())
}

// FuzzValidateEntryApplies checks the promise of ValidateEntry: whatever
// it accepts, the FSM applies, alone or in a batch, without panicking.
func FuzzValidateEntryApplies(f *testing.F) {
	for _, data := range validEntries() {
		f.Add(data)
	}
	for _, data := range undecodable() {
		f.Add(data)
	}
	f.Add(encode(randomEvents(rand.New(rand.NewPCG(9, 10)), 30)))
	f.Fuzz(func(t *testing.T, data []byte) {
		if raftstore.ValidateEntry(data) != nil {
			return
		}
		setup := [][]byte{raftstore.EncodeMemberUpsert(member(1)), raftstore.EncodeMemberUpsert(member(2)), encode(chainEvents(1, 3, n1DRAM))}
		one := raftstore.NewFSM()
		var logs []*raft.Log
		for i, d := range append(slices.Clone(setup), data) {
			l := &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: d}
			logs = append(logs, l)
			one.Apply(l)
		}
		batch := raftstore.NewFSM()
		batch.ApplyBatch(logs)
		if fmt.Sprint(one.Roster()) != fmt.Sprint(batch.Roster()) || dumpDir(one.Directory()) != dumpDir(batch.Directory()) {
			t.Fatal("Apply and ApplyBatch of a valid entry differ")
		}
		if one.Stats().Invalid != 0 {
			t.Fatal("a valid entry counted as invalid")
		}
	})
}

// BenchmarkValidateEntry1024 is what the check before the log costs the
// leader for a batch of 1024 events, next to BenchmarkEventBatchDecode1024.
func BenchmarkValidateEntry1024(b *testing.B) {
	data := encode(chainEvents(1, 1024, index.Location{Node: 2, Tier: index.TierDRAM}))
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := raftstore.ValidateEntry(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1024)/b.Elapsed().Seconds(), "events/s")
}

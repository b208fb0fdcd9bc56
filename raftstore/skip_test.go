package raftstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// unknownGarbage is what a client that sent {"entry":"Z2FyYmFnZQ=="} to
// Cluster/Propose put into the log of a build that did not validate
// proposals: an entry of type 0x67, unknown and not ignorable.
var unknownGarbage = []byte("garbage")

func TestFSMPanicTellsHowToSkipAnUnknownEntry(t *testing.T) {
	for _, batch := range []bool{false, true} {
		a := newApplier(t)
		a.ok(raftstore.EncodeMemberUpsert(member(1)))
		v := applyPanic(a, unknownGarbage, batch)
		err, ok := v.(error)
		if !ok || !errors.Is(err, raftstore.ErrUnknownEntry) {
			t.Fatalf("batch %v: panicked with %v, want ErrUnknownEntry", batch, v)
		}
		idx := a.idx // the last entry applyPanic made
		for _, want := range []string{
			fmt.Sprintf("apply entry %d", idx),
			"if this entry is not from a newer kvstrata (e.g. it was injected before proposals were validated), " +
				fmt.Sprintf("restart every node with --cluster-skip-entries %d", idx),
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("batch %v: the panic %q does not say %q", batch, err, want)
			}
		}
	}
}

// An FSM given SkipEntries applies the unknown entries listed as no-ops,
// and everything else at a listed index as usual.
func TestFSMSkipsTheListedUnknownEntries(t *testing.T) {
	logs := func(withGarbage bool) []*raft.Log {
		var out []*raft.Log
		add := func(typ raft.LogType, data []byte) {
			out = append(out, &raft.Log{Index: uint64(len(out) + 1), Term: 1, Type: typ, Data: data})
		}
		add(raft.LogCommand, raftstore.EncodeMemberUpsert(member(1)))
		if withGarbage {
			add(raft.LogCommand, unknownGarbage) // 2, listed: skipped
		} else {
			add(raft.LogNoop, nil)
		}
		add(raft.LogCommand, encode(chainEvents(1, 3, n1DRAM))) // 3, listed: applied
		add(raft.LogCommand, []byte("\x01garbage"))             // 4, listed: undecodable, a no-op as ever
		add(raft.LogNoop, nil)                                  // 5, listed: not a command
		add(raft.LogCommand, []byte{byte(raftstore.Ignorable | 0x11), 1})
		add(raft.LogCommand, encode(chainEvents(2, 3, n2SSD)))
		return out
	}
	want := raftstore.NewFSM()
	want.ApplyBatch(logs(false))
	for _, batch := range []bool{false, true} {
		f := raftstore.NewFSM()
		f.SkipEntries(2, 3, 4, 5, 99)
		var results []any
		if batch {
			results = f.ApplyBatch(logs(true))
		} else {
			for _, l := range logs(true) {
				results = append(results, f.Apply(l))
			}
		}
		if err, ok := results[1].(error); !ok || !errors.Is(err, raftstore.ErrUnknownEntry) {
			t.Errorf("batch %v: the skipped entry's result is %v, want ErrUnknownEntry", batch, results[1])
		}
		if results[2] != nil {
			t.Errorf("batch %v: the listed events' result is %v, want nil", batch, results[2])
		}
		if got := dumpDir(f.Directory()); got != dumpDir(want.Directory()) || got == "" {
			t.Errorf("batch %v: directory\n%s\nwant\n%s", batch, got, dumpDir(want.Directory()))
		}
		if fmt.Sprint(f.Roster()) != fmt.Sprint(want.Roster()) {
			t.Errorf("batch %v: cluster %+v, want %+v", batch, f.Roster(), want.Roster())
		}
		if st := f.Stats(); st.Skipped != 2 || st.Invalid != 1 || f.AppliedIndex() != 7 {
			t.Errorf("batch %v: %+v applied to %d, want 2 skipped (listed, ignorable), 1 invalid, applied to 7", batch, st, f.AppliedIndex())
		}
		// An unknown entry at an index not listed stops the replica still.
		a := &applier{t: t, f: f, idx: 7}
		if v := applyPanic(a, unknownGarbage, batch); v == nil {
			t.Errorf("batch %v: an unknown entry not listed did not panic", batch)
		}
	}
}

// TestAReplicaWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries puts an
// entry of an unknown type into a node's log, as a build that did not
// validate proposals did: opened as before, the node stops on it, and says
// how to go on; opened with the entry's index in SkipEntries, it leads and
// commits, again and again.
func TestAReplicaWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries(t *testing.T) {
	if dir := os.Getenv("RAFTSTORE_TEST_REPLICA_DIR"); dir != "" {
		// The child process: open the replica without the setting; it
		// should never get past the entry.
		r, err := raftstore.OpenReplica(raftstore.ReplicaConfig{ID: 1, Dir: dir, RaftAddr: os.Getenv("RAFTSTORE_TEST_REPLICA_ADDR"),
			Logger: quiet, HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Second)
		r.Close()
		return
	}
	dir := t.TempDir()
	cfg := raftstore.ReplicaConfig{ID: 1, Dir: dir, Logger: quiet, HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond}
	cfg.RaftAddr = freeRaftAddr(t)
	cfg.Bootstrap = []raftstore.Peer{{ID: 1, RaftAddr: cfg.RaftAddr}}
	open := func(cfg raftstore.ReplicaConfig) *raftstore.Replica {
		t.Helper()
		r, err := raftstore.OpenReplica(cfg)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the lone replica leads", r.IsLeader)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Propose(ctx, raftstore.EncodeMemberUpsert(member(1))); err != nil {
			t.Fatalf("propose: %v", err)
		}
		return r
	}
	if err := open(cfg).Close(); err != nil {
		t.Fatal(err)
	}
	idx := appendToLog(t, filepath.Join(dir, "log"), unknownGarbage)

	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RAFTSTORE_TEST_REPLICA_DIR="+dir, "RAFTSTORE_TEST_REPLICA_ADDR="+cfg.RaftAddr)
	out, err := cmd.CombinedOutput()
	hint := fmt.Sprintf("restart every node with --cluster-skip-entries %d", idx)
	if err == nil || !strings.Contains(string(out), hint) {
		t.Fatalf("opened without the setting, the node (%v) did not stop saying %q:\n%s", err, hint, out)
	}

	cfg.SkipEntries = []uint64{idx}
	for range 2 { // and again, over the entry a second time
		r := open(cfg)
		if st := r.FSM.Stats(); st.Skipped != 1 || r.FSM.AppliedIndex() <= idx {
			t.Errorf("with SkipEntries %d: %+v, applied to %d", idx, st, r.FSM.AppliedIndex())
		}
		if _, ok := r.FSM.Member(1); !ok {
			t.Error("with SkipEntries: the member record is gone")
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// appendToLog appends a command entry with data to the closed log store
// in dir, in the term of its last entry, as a leader that took it without
// checking it did, and returns its index.
func appendToLog(t *testing.T, dir string, data []byte) uint64 {
	t.Helper()
	store, err := raftstore.Open(dir, &raftstore.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	last, err := store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	var prev raft.Log
	if err := store.GetLog(last, &prev); err != nil {
		t.Fatal(err)
	}
	if err := store.StoreLog(&raft.Log{Index: last + 1, Term: prev.Term, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return last + 1
}

// TestAClusterWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries puts an
// entry of an unknown type at the same index of every log of a 3-node
// cluster, as a leader that took it unchecked did, and restarts every node
// with that index in SkipEntries: they all skip it alike, elect a leader,
// commit and converge.
func TestAClusterWhoseLogHoldsAnUnknownEntryComesBackWithSkipEntries(t *testing.T) {
	c := startCluster(t, 3, nil)
	for id := index.NodeID(1); id <= 3; id++ {
		c.propose(raftstore.EncodeMemberUpsert(member(id)))
	}
	c.feed(0, 5)
	c.converge()

	// Followers first, so that no one is elected and appends to its log.
	l := c.leader()
	var nodes []*testNode
	for _, nd := range c.nodes {
		if nd != l {
			nodes = append(nodes, nd)
		}
	}
	nodes = append(nodes, l)
	var idx uint64
	for _, nd := range nodes {
		c.stop(nd)
		i := appendToLog(t, filepath.Join(nd.dir, "raft"), unknownGarbage)
		if idx != 0 && i != idx {
			t.Fatalf("%s appended the entry at %d, another node at %d", nd.id, i, idx)
		}
		idx = i
	}
	for _, old := range nodes {
		nd := c.newNode(old.dir, old.id, old.addr)
		nd.fsm.SkipEntries(idx)
		c.start(nd, nil)
	}
	c.leader()
	c.feed(5, 8)
	c.converge()
	for _, nd := range c.nodes {
		if n := nd.fsm.Directory().Len(); n != 8*100 {
			t.Errorf("%s holds %d blocks, want 800", nd.id, n)
		}
		if st := nd.fsm.Stats(); st.Skipped != 1 || nd.fsm.AppliedIndex() <= idx {
			t.Errorf("%s: %+v, applied to %d; want the entry at %d skipped", nd.id, st, nd.fsm.AppliedIndex(), idx)
		}
	}
}

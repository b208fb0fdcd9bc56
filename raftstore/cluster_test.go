package raftstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// This file runs raft clusters in one process, over raft's in-memory
// transport, on the Pebble log store and the FSM: the real-socket cluster
// tests come with the daemon's wiring.

type testNode struct {
	id    raft.ServerID
	addr  raft.ServerAddress
	dir   string
	fsm   *raftstore.FSM
	store *raftstore.LogStore
	trans *raft.InmemTransport
	raft  *raft.Raft
}

type testCluster struct {
	t     testing.TB
	nodes []*testNode
	conf  func(*raft.Config)
}

// clusterConfig is raft's configuration for a fast cluster in one process.
func clusterConfig(id raft.ServerID) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = id
	c.Logger = hclog.NewNullLogger()
	c.HeartbeatTimeout = 100 * time.Millisecond
	c.ElectionTimeout = 100 * time.Millisecond
	c.LeaderLeaseTimeout = 100 * time.Millisecond
	c.CommitTimeout = 2 * time.Millisecond
	c.BatchApplyCh = true
	// Snapshots are forced by the tests.
	c.SnapshotInterval = time.Hour
	c.SnapshotThreshold = 1 << 40
	return c
}

// startCluster starts n voters that bootstrap together, and waits for a
// leader.
func startCluster(t testing.TB, n int, conf func(*raft.Config)) *testCluster {
	c := &testCluster{t: t, conf: conf}
	var servers []raft.Server
	for i := range n {
		nd := c.newNode(t.TempDir(), raft.ServerID(fmt.Sprintf("node%d", i+1)), "")
		servers = append(servers, raft.Server{ID: nd.id, Address: nd.addr})
	}
	for _, nd := range c.nodes {
		c.start(nd, &raft.Configuration{Servers: servers})
	}
	c.leader()
	return c
}

// newNode makes a node on the stores in dir, not started, connected to the
// others; addr "" picks one.
func (c *testCluster) newNode(dir string, id raft.ServerID, addr raft.ServerAddress) *testNode {
	nd := &testNode{id: id, dir: dir, fsm: raftstore.NewFSM()}
	nd.addr, nd.trans = raft.NewInmemTransport(addr)
	for _, o := range c.nodes {
		if o.addr == nd.addr {
			continue
		}
		o.trans.Connect(nd.addr, nd.trans)
		nd.trans.Connect(o.addr, o.trans)
	}
	var kept []*testNode
	for _, o := range c.nodes {
		if o.addr != nd.addr {
			kept = append(kept, o)
		}
	}
	c.nodes = append(kept, nd)
	return nd
}

// start opens nd's stores and starts raft, bootstrapping it with conf if
// conf is not nil.
func (c *testCluster) start(nd *testNode, conf *raft.Configuration) {
	t := c.t
	store, err := raftstore.Open(filepath.Join(nd.dir, "raft"), &raftstore.Options{Logger: quiet})
	if err != nil {
		t.Fatalf("%s: %v", nd.id, err)
	}
	nd.store = store
	logs, err := raft.NewLogCache(512, store)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(nd.dir, "snapshots"), 2, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	cfg := clusterConfig(nd.id)
	if c.conf != nil {
		c.conf(cfg)
	}
	if conf != nil {
		if err := raft.BootstrapCluster(cfg, logs, store, snaps, nd.trans, *conf); err != nil {
			t.Fatalf("%s: bootstrap: %v", nd.id, err)
		}
	}
	if nd.raft, err = raft.NewRaft(cfg, nd.fsm, logs, store, snaps, nd.trans); err != nil {
		t.Fatalf("%s: NewRaft: %v", nd.id, err)
	}
	t.Cleanup(func() { c.stop(nd) })
}

// stop shuts nd down and closes its store; it may be called twice.
func (c *testCluster) stop(nd *testNode) {
	if nd.raft == nil {
		return
	}
	if err := nd.raft.Shutdown().Error(); err != nil {
		c.t.Errorf("%s: shutdown: %v", nd.id, err)
	}
	nd.raft = nil
	if err := nd.store.Close(); err != nil {
		c.t.Errorf("%s: close store: %v", nd.id, err)
	}
}

// leader waits for a leader and returns it.
func (c *testCluster) leader() *testNode {
	c.t.Helper()
	var l *testNode
	eventually(c.t, "a leader", func() bool {
		for _, nd := range c.nodes {
			if nd.raft != nil && nd.raft.State() == raft.Leader {
				l = nd
				return true
			}
		}
		return false
	})
	return l
}

// converge waits until every running node has applied what the leader has,
// and checks that they all hold the leader's state.
func (c *testCluster) converge() {
	c.t.Helper()
	l := c.leader()
	if err := l.raft.Barrier(10 * time.Second).Error(); err != nil {
		c.t.Fatalf("barrier: %v", err)
	}
	want := l.fsm.AppliedIndex()
	wantDir, wantCluster := dumpDir(l.fsm.Directory()), fmt.Sprint(l.fsm.Roster())
	for _, nd := range c.nodes {
		if nd.raft == nil || nd == l {
			continue
		}
		eventually(c.t, fmt.Sprintf("%s to apply index %d", nd.id, want), func() bool { return nd.fsm.AppliedIndex() >= want })
		if dumpDir(nd.fsm.Directory()) != wantDir || fmt.Sprint(nd.fsm.Roster()) != wantCluster {
			c.t.Fatalf("%s holds another state than the leader %s", nd.id, l.id)
		}
	}
}

// propose applies data through the leader and fails on any error.
func (c *testCluster) propose(data []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := raftstore.RaftPropose(c.leader().raft)(ctx, data); err != nil {
		c.t.Fatalf("propose %v: %v", raftstore.EntryType(data[0]), err)
	}
}

// feed adds the events of chains [from, to) of 100 blocks each through a
// batcher on the leader, and flushes.
func (c *testCluster) feed(from, to uint64) {
	c.t.Helper()
	b := newBatcher(c.t, raftstore.BatcherConfig{Propose: raftstore.RaftPropose(c.leader().raft), MaxEvents: 256})
	for seed := from; seed < to; seed++ {
		addAll(c.t, b, chainEvents(seed, 100, index.Location{Node: index.NodeID(1 + seed%3), Tier: index.TierDRAM}))
	}
	flush(c.t, b)
	leader := c.leader().raft
	idx := b.CommittedIndex()
	if idx == 0 || idx > leader.LastIndex() {
		c.t.Fatalf("after a flush the batcher says it committed up to index %d; the leader's log ends at %d",
			idx, leader.LastIndex())
	}
	// raft answers an Apply once its FSM applied the entry, and records
	// the applied index on its own goroutine a moment later.
	for deadline := time.Now().Add(10 * time.Second); leader.AppliedIndex() < idx; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("10 s after a flush committed up to index %d, the leader has applied only up to %d", idx, leader.AppliedIndex())
		}
	}
	if err := b.Close(); err != nil {
		c.t.Fatal(err)
	}
}

func TestClusterReplicatesBatchedEventsToEveryReplica(t *testing.T) {
	c := startCluster(t, 3, nil)
	for id := index.NodeID(1); id <= 3; id++ {
		c.propose(raftstore.EncodeMemberUpsert(member(id)))
	}
	c.feed(0, 100)
	c.propose(raftstore.EncodeLiveness(2, false, t0))
	c.converge()
	for _, nd := range c.nodes {
		if n := nd.fsm.Directory().Len(); n != 100*100 {
			t.Fatalf("%s holds %d blocks, want 10000", nd.id, n)
		}
		// Chain 1 is held by node 2 only.
		if p := nd.fsm.Lookup(testNS, chainHashes(chainEvents(1, 100, n2SSD))); p.Blocks != 0 {
			t.Fatalf("%s: Lookup of a chain held by node 2, which is down, found %+v", nd.id, p)
		}
	}
}

func TestClusterCatchesUpNewAndRestartedNodesFromSnapshots(t *testing.T) {
	c := startCluster(t, 3, func(cfg *raft.Config) { cfg.TrailingLogs = 4 })
	for id := index.NodeID(1); id <= 3; id++ {
		c.propose(raftstore.EncodeMemberUpsert(member(id)))
	}
	c.feed(0, 50)
	// Snapshot every node: the log before the snapshot is compacted away,
	// so that a node that lacks it can only catch up by a snapshot.
	for _, nd := range c.nodes {
		if err := nd.raft.Snapshot().Error(); err != nil {
			t.Fatalf("%s: snapshot: %v", nd.id, err)
		}
	}
	c.feed(50, 60)
	l := c.leader()
	if first, _ := l.store.FirstIndex(); first <= 1 {
		t.Fatalf("the leader's log still starts at %d after the snapshot", first)
	}

	// A new node gets the leader's snapshot by InstallSnapshot.
	nd := c.newNode(t.TempDir(), "node4", "")
	c.start(nd, nil)
	if err := l.raft.AddVoter(nd.id, nd.addr, 0, 10*time.Second).Error(); err != nil {
		t.Fatalf("AddVoter: %v", err)
	}
	c.propose(raftstore.EncodeMemberUpsert(member(4)))
	c.converge()
	if got := nd.raft.Stats()["last_snapshot_index"]; got == "0" {
		t.Fatal("node4 caught up without a snapshot")
	}

	// A follower restarted on its stores restores its own snapshot and
	// replays the log after it.
	var f *testNode
	for _, o := range c.nodes {
		if o != c.leader() && o != nd {
			f = o
			break
		}
	}
	c.stop(f)
	c.feed(60, 70)
	restarted := c.newNode(f.dir, f.id, f.addr)
	c.start(restarted, nil)
	if got := restarted.raft.Stats()["last_snapshot_index"]; got == "0" {
		t.Fatalf("restarted %s found no snapshot of its own", f.id)
	}
	c.converge()
	if restarted.fsm.Directory().Len() != 70*100 {
		t.Fatalf("restarted %s holds %d blocks, want 7000", f.id, restarted.fsm.Directory().Len())
	}
}

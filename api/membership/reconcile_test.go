package membership_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// startClusterWith starts n members as startCluster does, each with cfg.
func startClusterWith(t testing.TB, n int, cfg membership.Config) *testCluster {
	t.Helper()
	tc := &testCluster{t: t}
	var peers []raftstore.Peer
	for i := 1; i <= n; i++ {
		m := tc.newMember(index.NodeID(i))
		peers = append(peers, raftstore.Peer{ID: m.id, RaftAddr: m.raftAddr})
	}
	for _, m := range tc.members {
		c := cfg
		c.Bootstrap = peers
		tc.open(m, c)
	}
	tc.waitSettled()
	return tc
}

// ownListing returns what m's replica lists at node: key → tier kinds.
func ownListing(m *member, node index.NodeID) map[index.Key][]index.TierKind {
	out := map[index.Key][]index.TierKind{}
	m.c.FSM().Directory().Range(func(k index.Key, e index.Entry) bool {
		for _, l := range e.Locations {
			if l.Node == node {
				out[k] = append(out[k], l.Tier)
			}
		}
		return true
	})
	return out
}

// sameListing reports whether got lists exactly want (tier order aside).
func sameListing(got, want map[index.Key][]index.TierKind) bool {
	return maps.EqualFunc(got, want, func(a, b []index.TierKind) bool {
		if len(a) != len(b) {
			return false
		}
		for _, t := range a {
			found := false
			for _, u := range b {
				found = found || t == u
			}
			if !found {
				return false
			}
		}
		return true
	})
}

func syncOrFail(t testing.TB, m *member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.c.Sync(ctx); err != nil {
		t.Fatalf("node %d: sync: %v", m.id, err)
	}
}

func key(i int) index.Key { return index.Key{NS: testNS, Hash: index.Hash(i + 1)} }

func stored(i int, node index.NodeID, tier index.TierKind) index.Change {
	return index.Change{Kind: index.ChangeStored, Key: key(i), Meta: index.Meta{Size: 64 << 10}, Loc: index.Location{Node: node, Tier: tier}}
}

func removed(i int, node index.NodeID, tier index.TierKind) index.Change {
	return index.Change{Kind: index.ChangeRemoved, Key: key(i), Loc: index.Location{Node: node, Tier: tier}}
}

// Changes the directory never hears of — dropped by a full queue,
// discarded by a shutdown — leave phantoms (blocks listed that the node
// no longer holds) and lost hits (blocks held but not listed) until the
// block changes again. A reconcile pass restates the node's truth about
// exactly the keys that differ, and a consistent node corrects nothing.
func TestReconcileRestoresWhatTheDirectoryLost(t *testing.T) {
	tc := startClusterWith(t, 3, membership.Config{ReconcileInterval: time.Hour}) // passes run on demand only
	p := tc.follower()
	want := map[index.Key][]index.TierKind{}
	for i := range 100 {
		p.c.Publish(stored(i, p.id, index.TierDRAM))
		want[key(i)] = []index.TierKind{index.TierDRAM}
	}
	syncOrFail(t, p)
	if n, err := p.c.Reconcile(context.Background()); err != nil || n != 0 {
		t.Fatalf("a pass over a consistent node corrected %d keys (%v); want 0", n, err)
	}

	for i := range 10 { // removed: phantoms
		p.c.LosePublish(removed(i, p.id, index.TierDRAM))
		delete(want, key(i))
	}
	for i := 100; i < 110; i++ { // stored: lost hits
		p.c.LosePublish(stored(i, p.id, index.TierSSD))
		want[key(i)] = []index.TierKind{index.TierSSD}
	}
	p.c.LosePublish(stored(20, p.id, index.TierSSD)) // demoted: both
	p.c.LosePublish(removed(20, p.id, index.TierDRAM))
	want[key(20)] = []index.TierKind{index.TierSSD}
	p.c.Publish(stored(30, p.id, index.TierSSD)) // copied, and heard of: no difference
	want[key(30)] = []index.TierKind{index.TierDRAM, index.TierSSD}
	syncOrFail(t, p)
	if got := ownListing(p, p.id); sameListing(got, want) {
		t.Fatal("the lost changes are listed without a pass")
	}

	n, err := p.c.Reconcile(context.Background())
	if err != nil || n != 21 {
		t.Fatalf("the pass corrected %d keys (%v); want 21", n, err)
	}
	syncOrFail(t, p)
	for _, m := range tc.running() {
		waitFor(t, 10*time.Second, fmt.Sprintf("node %d's replica lists what node %d holds", m.id, p.id), func() bool {
			return sameListing(ownListing(m, p.id), want)
		})
	}
	if s := p.c.ReconcileStats(); s.Corrected != 21 || s.Phantoms != 11 || s.Missing != 11 {
		t.Errorf("stats %+v; want 21 keys corrected, 11 phantoms (10 removed, 1 demoted), 11 missing (10 stored, 1 demoted)", s)
	}
	if n, err := p.c.Reconcile(context.Background()); err != nil || n != 0 {
		t.Fatalf("a second pass corrected %d keys (%v); want 0", n, err)
	}
}

// A node whose cluster has no quorum for long fills its queue and drops
// its changes; the pass that follows the drop, once the cluster is back,
// lists what the drop lost, without waiting for the periodic pass.
func TestReconcileFollowsDroppedEvents(t *testing.T) {
	tc := startClusterWith(t, 3, membership.Config{ReconcileInterval: time.Hour, EventQueueSize: raftstore.DefaultMaxEvents})
	p := tc.follower()
	var others []*member
	for _, m := range tc.running() {
		if m != p {
			others = append(others, m)
			tc.stop(m)
		}
	}
	const blocks = raftstore.DefaultMaxEvents + 500
	want := map[index.Key][]index.TierKind{}
	for i := range blocks {
		p.c.Publish(stored(i, p.id, index.TierDRAM))
		want[key(i)] = []index.TierKind{index.TierDRAM}
	}
	if s := p.c.BatcherStats(); s.Dropped < 500 {
		t.Fatalf("the batcher dropped %d events; the test wants at least 500 dropped (%+v)", s.Dropped, s)
	}
	for _, m := range others {
		tc.reopen(m)
	}
	tc.waitSettled()
	waitFor(t, 60*time.Second, "the directory lists every block the node holds", func() bool {
		return sameListing(ownListing(p, p.id), want)
	})
	if s := p.c.ReconcileStats(); s.Missing < 500 || s.Phantoms != 0 {
		t.Errorf("stats %+v; want at least the 500 dropped blocks missing, no phantom", s)
	}
}

// Passes running while the node's blocks are stored, moved between tiers
// and removed must correct nothing: a change in flight, published but not
// applied yet, is no difference.
func TestReconcileWhileBlocksMove(t *testing.T) {
	tc := startClusterWith(t, 3, membership.Config{ReconcileInterval: time.Hour})
	p := tc.follower()
	var mu sync.Mutex
	want := map[index.Key][]index.TierKind{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			mu.Lock()
			p.c.Publish(stored(i, p.id, index.TierDRAM)) // stored
			want[key(i)] = []index.TierKind{index.TierDRAM}
			if i >= 1 { // demoted
				p.c.Publish(stored(i-1, p.id, index.TierSSD))
				p.c.Publish(removed(i-1, p.id, index.TierDRAM))
				want[key(i-1)] = []index.TierKind{index.TierSSD}
			}
			if i >= 2 && rand.N(2) == 0 { // dropped
				p.c.Publish(removed(i-2, p.id, index.TierSSD))
				delete(want, key(i-2))
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	var passes int
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); passes++ {
		if _, err := p.c.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	syncOrFail(t, p)
	if got := ownListing(p, p.id); !sameListing(got, want) {
		t.Fatalf("after %d passes during the moves, the directory lists %d keys of the node, which holds %d, differently", passes, len(got), len(want))
	}
	if s := p.c.ReconcileStats(); s.Corrected != 0 {
		t.Errorf("%d passes during the moves, none of them lost, corrected: %+v; want nothing", passes, s)
	}
}

// BenchmarkReconcilePass measures a pass over a consistent node: one scan
// of a replica listing 100,000 of the node's blocks, no correction.
func BenchmarkReconcilePass(b *testing.B) {
	tc := startClusterWith(b, 1, membership.Config{ReconcileInterval: time.Hour})
	p := tc.running()[0]
	for i := range 100_000 {
		p.c.Publish(stored(i, p.id, index.TierDRAM))
	}
	syncOrFail(b, p)
	for b.Loop() {
		if n, err := p.c.Reconcile(context.Background()); err != nil || n != 0 {
			b.Fatalf("a pass corrected %d (%v)", n, err)
		}
	}
}

// BenchmarkPublishMirror measures Publish, with the mirror the reconcile pass
// compares with and without it (reconciling off).
func BenchmarkPublishMirror(b *testing.B) {
	for _, bc := range []struct {
		name     string
		interval time.Duration
	}{{"reconcile", time.Hour}, {"off", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			tc := startClusterWith(b, 1, membership.Config{ReconcileInterval: bc.interval})
			p := tc.running()[0]
			i := 0
			for b.Loop() {
				p.c.Publish(stored(i%100_000, p.id, index.TierDRAM))
				i++
			}
			b.StopTimer()
			syncOrFail(b, p)
		})
	}
}

package membership_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/index"
)

// A block stored again where the node stores it, with the metadata the
// directory lists for it (a key overwritten by a value of the same size),
// changes nothing in the directory and is not proposed. Every store that
// does change it still is: new metadata, a store after a removal, a store
// the directory lost, a location the node shares with others, and a store
// whose metadata another node has changed meanwhile.
func TestPublishLeavesOutStoresThatChangeNothing(t *testing.T) {
	tc := startClusterWith(t, 3, membership.Config{ReconcileInterval: time.Hour})
	p := tc.follower()
	var q *member
	for _, m := range tc.running() {
		if m != p {
			q = m
			break
		}
	}
	added := func() uint64 { return p.c.BatcherStats().Added }
	queued := func(what string, want uint64, publish func()) {
		t.Helper()
		before := added()
		publish()
		if n := added() - before; n != want {
			t.Fatalf("%s: %d events queued, want %d", what, n, want)
		}
	}
	dram := index.TierDRAM
	meta := func(m *member, i int) index.Meta {
		e, _ := m.c.FSM().Directory().Get(key(i))
		return e.Meta
	}

	queued("the first store", 1, func() { p.c.Publish(stored(0, p.id, dram)) })
	syncOrFail(t, p)
	unchanged := p.c.Unchanged()
	queued("1000 stores of a block listed as it is", 0, func() {
		for range 1000 {
			p.c.Publish(stored(0, p.id, dram))
		}
	})
	if n := p.c.Unchanged() - unchanged; n != 1000 {
		t.Fatalf("1000 stores left out, %d counted", n)
	}

	resized := stored(0, p.id, dram)
	resized.Meta.Size = 100
	queued("a store with a new size", 1, func() { p.c.Publish(resized) })
	syncOrFail(t, p)
	queued("the same store again, once applied", 0, func() { p.c.Publish(resized) })
	queued("a removal and a store", 2, func() {
		p.c.Publish(removed(0, p.id, dram))
		p.c.Publish(resized)
	})
	p.c.LosePublish(stored(1, p.id, dram))
	queued("a store the directory never heard of, again", 1, func() { p.c.Publish(stored(1, p.id, dram)) })
	shared := index.Change{Kind: index.ChangeStored, Key: key(2), Meta: index.Meta{Size: 64 << 10},
		Loc: index.Location{Node: index.AnyNode, Tier: index.TierS3}}
	queued("a store at a shared location", 1, func() { p.c.Publish(shared) })
	syncOrFail(t, p)
	queued("the same store at a shared location, once applied", 1, func() { p.c.Publish(shared) })

	// Another holder of block 0 lists another size; p's store of its own
	// size, unchanged for p, changes the block's metadata back.
	other := stored(0, q.id, dram)
	other.Meta.Size = 200
	q.c.Publish(other)
	syncOrFail(t, q)
	waitFor(t, 10*time.Second, "p's replica lists q's size", func() bool { return meta(p, 0).Size == 200 })
	queued("a store whose metadata another node changed", 1, func() { p.c.Publish(resized) })
	syncOrFail(t, p)

	for _, m := range tc.running() {
		waitFor(t, 10*time.Second, fmt.Sprintf("node %d's replica lists every store", m.id), func() bool {
			return sameListing(ownListing(m, p.id), map[index.Key][]index.TierKind{key(0): {dram}, key(1): {dram}}) &&
				sameListing(ownListing(m, q.id), map[index.Key][]index.TierKind{key(0): {dram}}) &&
				meta(m, 0).Size == 100 && meta(m, 1).Size == 64<<10 &&
				sameListing(ownListing(m, index.AnyNode), map[index.Key][]index.TierKind{key(2): {index.TierS3}})
		})
	}
}

// Without the mirror of what the node published (reconciling off), every
// store is proposed.
func TestPublishWithoutReconcilingQueuesEveryStore(t *testing.T) {
	tc := startClusterWith(t, 1, membership.Config{ReconcileInterval: -1})
	p := tc.running()[0]
	p.c.Publish(stored(0, p.id, index.TierDRAM))
	syncOrFail(t, p)
	before := p.c.BatcherStats().Added
	for range 10 {
		p.c.Publish(stored(0, p.id, index.TierDRAM))
	}
	if n := p.c.BatcherStats().Added - before; n != 10 {
		t.Fatalf("10 stores queued %d events; want 10", n)
	}
}

// BenchmarkPublishOverwrite publishes a block stored again and again at
// the node's DRAM with the same metadata, as SETs of one key by values of
// one size make, ten every millisecond (about the pace of a node taking
// 64 KiB SETs), on a cluster of one. It reports the process's CPU per
// publish, the batcher's proposals and raft's log included, and the
// proposals made per 1000 publishes.
//
//	go test -run '^$' -bench PublishOverwrite -benchtime 20000x ./api/membership
func BenchmarkPublishOverwrite(b *testing.B) {
	tc := startClusterWith(b, 1, membership.Config{ReconcileInterval: time.Hour})
	p := tc.running()[0]
	ch := stored(0, p.id, index.TierDRAM)
	p.c.Publish(ch)
	syncOrFail(b, p)
	proposals, cpu := p.c.BatcherStats().Proposals, cpuTime(b)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	n := 0
	for b.Loop() {
		if n%10 == 0 {
			<-tick.C
		}
		p.c.Publish(ch)
		n++
	}
	syncOrFail(b, p)
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(p.c.BatcherStats().Proposals-proposals)*1000/float64(n), "proposals/1000op")
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

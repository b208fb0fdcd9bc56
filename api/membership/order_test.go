package membership_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// A node's directory events must be applied in the order it published
// them, whatever happens to the leadership meanwhile. The leader proposes
// several batches at once (the batcher pipelines them into raft); when it
// is deposed, those proposals fail together. Each used to be forwarded to
// the new leader on its own, at the same time, so a later batch could be
// committed before an earlier one and nothing put them back in order: a
// block stored in one batch and removed in the next stayed listed for
// good.
func TestEventsStayInOrderAcrossLeadershipChanges(t *testing.T) {
	tc := startCluster(t, 3)
	p := tc.leader() // the publisher, deposed and elected again below
	loc := index.Location{Node: p.id, Tier: index.TierDRAM}
	k := func(i int) index.Key { return index.Key{NS: 9, Hash: index.Hash(i + 1)} }

	// Each block is stored, and removed a moment later, in a later batch.
	stop := make(chan struct{})
	var published sync.WaitGroup
	last := 0
	published.Go(func() {
		for i := 0; ; i++ {
			p.c.Publish(index.Change{Kind: index.ChangeStored, Key: k(i), Meta: index.Meta{Size: 1}, Loc: loc})
			if i > 0 {
				p.c.Publish(index.Change{Kind: index.ChangeRemoved, Key: k(i - 1), Loc: loc})
			}
			select {
			case <-stop:
				last = i
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	for range 3 {
		// The publisher loses its quorum while it leads: its batches in
		// flight fail together once its lease runs out, and it finds a
		// leader again when the others are back.
		waitFor(t, 30*time.Second, "the publisher leads", func() bool {
			if l := p.c.Leader(); l != 0 && l != p.id {
				_ = tc.byID(l).c.HandLeadershipTo(p.id)
			}
			return p.c.Leader() == p.id
		})
		time.Sleep(100 * time.Millisecond) // batches in flight
		var others []*member
		for _, m := range tc.running() {
			if m != p {
				others = append(others, m)
				tc.stop(m)
			}
		}
		waitFor(t, 10*time.Second, "the publisher steps down", func() bool { return p.c.Leader() != p.id })
		for _, m := range others {
			tc.reopen(m)
		}
		tc.waitSettled()
	}
	close(stop)
	published.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.c.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	// Only the last block was never removed.
	var listed []int
	p.c.FSM().Directory().Range(func(key index.Key, _ index.Entry) bool {
		if key.NS == 9 {
			listed = append(listed, int(key.Hash)-1)
		}
		return true
	})
	if len(listed) != 1 || listed[0] != last {
		t.Fatalf("after %d blocks stored and removed in turn, the directory lists blocks %v; want only the last, %d", last+1, listed, last)
	}
}

// byID returns member id.
func (tc *testCluster) byID(id index.NodeID) *member {
	for _, m := range tc.members {
		if m.id == id {
			return m
		}
	}
	tc.t.Fatalf("no member %d", id)
	return nil
}

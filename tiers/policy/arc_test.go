package policy

import (
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

func TestARCBlockUsedAgainMovesToT2(t *testing.T) {
	p := NewARC()
	for i := range 10 {
		p.Add(entry(i))
	}
	p.Touch(key(0))
	if n := p.items[key(0)]; n.queue != inT2 {
		t.Fatalf("block 0 used again is in list %d, want T2", n.queue)
	}
	// T1 is above its target (0): its least recent block goes, not 0.
	wantVictim(t, p, 1)
}

func TestARCGhostHitsSteerTheTarget(t *testing.T) {
	p := NewARC()
	for i := range 10 {
		p.Add(entry(i))
	}
	wantVictim(t, p, 0)
	p.Remove(key(0)) // evicted from T1: a ghost in B1
	if !p.b1.has(key(0)) {
		t.Fatal("a block evicted from T1 left no ghost in B1")
	}
	p.Add(entry(0)) // recency would have kept it: T1's target grows
	if n := p.items[key(0)]; n.queue != inT2 || p.target != 1 {
		t.Fatalf("after a B1 hit: block in list %d, target %d; want T2 and 1", n.queue, p.target)
	}
	if p.b1.has(key(0)) {
		t.Fatal("the ghost stayed after its block came back")
	}
	// Now evict 0 from T2 (T1 of nine is above the target, so skip it all)
	// and bring it back: frequency would have kept it, the target shrinks.
	wantVictimSkip(t, p, func(k index.Key) bool { return k != key(0) }, 0)
	p.Remove(key(0))
	if !p.b2.has(key(0)) {
		t.Fatal("a block evicted from T2 left no ghost in B2")
	}
	p.Add(entry(0))
	if p.target != 0 {
		t.Fatalf("after a B2 hit the target is %d, want 0", p.target)
	}
}

func TestARCGhostListsAreBoundedByTheBlocksHeld(t *testing.T) {
	p := NewARC()
	fillEvicting(t, p, 200, 0, 10_000)
	if n := p.b1.len() + p.b2.len(); n > ghostsPerBlock*200 {
		t.Fatalf("%d ghosts with 200 blocks held", n)
	}
}

func TestPrefixAwareFormsEvictTheLeavesOfAChainBeforeItsRoot(t *testing.T) {
	for _, pc := range []struct {
		name string
		new  func() Policy
	}{
		{"arc-prefix", func() Policy { return NewARCPrefix() }},
		{"wtinylfu-prefix", func() Policy { return NewWTinyLFUPrefix() }},
		{"lhd", func() Policy { return NewLHD() }},
	} {
		t.Run(pc.name, func(t *testing.T) {
			p := pc.new()
			p.Add(entry(0))
			for i := 1; i < 5; i++ { // one chain 0 → 1 → … → 4, root first
				p.Add(child(i, i-1))
			}
			// The plain forms evict 0, the oldest, stranding 1–4; the
			// prefix-aware ones take the chain leaf by leaf.
			wantDrain(t, p, 4, 3, 2, 1, 0)
		})
	}
}

func TestPrefixAwareFormsFallBackWhenSkipLeavesNoLeaf(t *testing.T) {
	for _, p := range []Policy{NewARCPrefix(), NewWTinyLFUPrefix(), NewLHD()} {
		p.Add(entry(0))
		p.Add(child(1, 0))
		wantVictimSkip(t, p, func(k index.Key) bool { return k == key(1) }, 0)
	}
}

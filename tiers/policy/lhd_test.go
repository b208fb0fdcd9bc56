package policy

import "testing"

func TestLHDLearnsToKeepBlocksThatComeBack(t *testing.T) {
	// 50 hot blocks used in turn, each followed by three blocks used once:
	// a hot block comes back after 199 other blocks, so a cache of 100
	// that ranks by recency (LRU) never hits it. LHD learns from the hot
	// blocks' ghosts that blocks used before come back, and from the
	// others that blocks used once do not.
	for _, pc := range []struct {
		name    string
		new     func() Policy
		atLeast float64
	}{
		{"lhd", func() Policy { return NewLHD() }, 0.9},
		{"lru", func() Policy { return NewLRU() }, 0},
	} {
		p := pc.new()
		const capacity, hot = 100, 50
		next := 1000 // keys of blocks used once
		access := func(k int) bool {
			if p.Touch(key(k)) {
				return true
			}
			if p.Len() >= capacity {
				v, ok := p.Victim(nil)
				if !ok {
					t.Fatalf("%s: no victim with %d blocks held", pc.name, p.Len())
				}
				p.Remove(v)
			}
			p.Add(entry(k))
			return false
		}
		hits, uses := 0, 0
		for step := range 40_000 {
			hit := access(step % hot)
			for range 3 {
				access(next)
				next++
			}
			if step >= 30_000 {
				uses++
				if hit {
					hits++
				}
			}
		}
		rate := float64(hits) / float64(uses)
		t.Logf("%s: hot blocks hit %.1f %% of the time", pc.name, 100*rate)
		if rate < pc.atLeast || (pc.atLeast == 0 && rate > 0.01) {
			t.Errorf("%s: hot blocks hit %.3f of the time, want %s %.2f", pc.name, rate, map[bool]string{true: "≤", false: "≥"}[pc.atLeast == 0], max(pc.atLeast, 0.01))
		}
	}
}

func TestLHDGhostRemembersHowOftenABlockWasUsed(t *testing.T) {
	p := NewLHD()
	p.Add(entry(1))
	p.Touch(key(1))
	p.Touch(key(1))
	p.Remove(key(1))
	if p.ghost.len() != 1 {
		t.Fatalf("%d ghosts after one removal, want 1", p.ghost.len())
	}
	p.Add(entry(1))
	if n := p.items[key(1)]; n.uses != 3 {
		t.Fatalf("block back from its ghost has %d uses before this one, want 3", n.uses)
	}
	if p.ghost.len() != 0 {
		t.Fatal("the ghost stayed after its block came back")
	}
}

func TestLHDMarksABlockThatGotAChild(t *testing.T) {
	p := NewLHD()
	p.Add(entry(0))
	p.Add(child(1, 0))
	p.Add(child(2, 1))
	for _, c := range []struct {
		key      int
		depth    uint8
		hadChild bool
		children bool
		leaf     bool
	}{
		{0, 0, true, true, false},
		{1, 1, true, true, false},
		{2, 2, false, false, true},
	} {
		n := p.items[key(c.key)]
		if n.depth != c.depth || n.hadChild != c.hadChild || p.chains.hasChildren(key(c.key)) != c.children || (n.leafIdx >= 0) != c.leaf {
			t.Errorf("block %d: depth %d, had a child %v, has children %v, leaf %v; want %d, %v, %v, %v",
				c.key, n.depth, n.hadChild, p.chains.hasChildren(key(c.key)), n.leafIdx >= 0, c.depth, c.hadChild, c.children, c.leaf)
		}
	}
	// The leaf goes; its parent becomes a leaf but keeps the mark.
	p.Remove(key(2))
	if n := p.items[key(1)]; n.leafIdx < 0 || !n.hadChild {
		t.Fatalf("block 1 after its child left: leaf %v, had a child %v", n.leafIdx >= 0, n.hadChild)
	}
}

func TestLHDParentStoredAfterItsChildIsNoLeaf(t *testing.T) {
	// An SSD is given a chain's blocks leaf first, as DRAM evicts them.
	p := NewLHD()
	p.Add(child(2, 1))
	p.Add(child(1, 0))
	p.Add(entry(0))
	p.Touch(key(2)) // the least recently used is now 1, which has a child
	wantDrain(t, p, 2, 1, 0)
}

func TestLHDGhostsAreBoundedByTheBlocksHeld(t *testing.T) {
	p := NewLHD()
	fillEvicting(t, p, 200, 0, 10_000)
	if n := p.ghost.len(); n > ghostsPerBlock*200 {
		t.Fatalf("%d ghosts with 200 blocks held", n)
	}
	if n := len(p.ghost.ring); n > 4*ghostsPerBlock*200+64 {
		t.Fatalf("ghost ring of %d slots with 200 blocks held", n)
	}
	if len(p.nodes) != 200 || len(p.leaves) != 200 {
		t.Fatalf("%d nodes and %d leaves listed with 200 unchained blocks held", len(p.nodes), len(p.leaves))
	}
}

func TestLHDIsDeterministic(t *testing.T) {
	a, b := NewLHD(), NewLHD()
	for i := range 5000 {
		e := entry(i % 700)
		if i%7 != 0 {
			e = child(i%700, (i-1)%700)
		}
		for _, p := range []Policy{a, b} {
			if p.Len() >= 300 {
				v, _ := p.Victim(nil)
				p.Remove(v)
			}
			p.Add(e)
		}
		va, _ := a.Victim(nil)
		vb, _ := b.Victim(nil)
		if va != vb {
			t.Fatalf("step %d: victims %v and %v from the same operations", i, va, vb)
		}
	}
}

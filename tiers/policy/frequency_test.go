package policy

import (
	"runtime"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// fill adds blocks first..last-1 once each, evicting whenever more than
// capacity are held, as a full tier does before storing a block.
func fillEvicting(t *testing.T, p Policy, capacity, first, last int) {
	t.Helper()
	for i := first; i < last; i++ {
		if p.Len() >= capacity {
			v, ok := p.Victim(nil)
			if !ok {
				t.Fatalf("no victim with %d blocks held", p.Len())
			}
			p.Remove(v)
		}
		p.Add(entry(i))
		if p.Len() > capacity {
			t.Fatalf("holding %d blocks, capacity %d", p.Len(), capacity)
		}
	}
}

func TestOneHitWondersDoNotEvictAFrequentlyUsedBlock(t *testing.T) {
	for _, pc := range []struct {
		name string
		new  func() Policy
	}{
		{"s3fifo", func() Policy { return NewS3FIFO() }},
		{"wtinylfu", func() Policy { return NewWTinyLFU() }},
		{"arc", func() Policy { return NewARC() }},
		// Not lhd: it protects a block only once its histograms have
		// seen blocks like it hit at its age, which this short scan does
		// not show it; see TestLHDLearnsToKeepBlocksThatComeBack.
	} {
		t.Run(pc.name, func(t *testing.T) {
			const capacity = 100
			p := pc.new()
			fillEvicting(t, p, capacity, 0, capacity)
			// Block 0 is used often; then a scan of 1,000 blocks used once each.
			for range 3 {
				p.Touch(key(0))
			}
			fillEvicting(t, p, capacity, 1000, 1500)
			p.Touch(key(0))
			fillEvicting(t, p, capacity, 1500, 2000)
			if !p.Touch(key(0)) {
				t.Fatal("a scan of blocks used once evicted the frequently used block")
			}
		})
	}
	t.Run("lru, for contrast, loses it", func(t *testing.T) {
		p := NewLRU()
		fillEvicting(t, p, 100, 0, 100)
		p.Touch(key(0))
		fillEvicting(t, p, 100, 1000, 1500)
		if p.Touch(key(0)) {
			t.Fatal("LRU kept a block 500 insertions old in a cache of 100")
		}
	})
}

func TestS3FIFOBlockUsedAgainInSmallMovesToMain(t *testing.T) {
	p := NewS3FIFO()
	for i := range 10 {
		p.Add(entry(i))
	}
	p.Touch(key(0)) // the oldest, used again while in small
	// Victim moves 0 to main and names the next oldest of small.
	wantVictim(t, p, 1)
	if n := p.items[key(0)]; n.queue != inMain || n.freq != 0 {
		t.Fatalf("block 0: queue %d freq %d, want main with frequency 0", n.queue, n.freq)
	}
}

func TestS3FIFOGhostHitGoesToMain(t *testing.T) {
	p := NewS3FIFO()
	for i := range 10 {
		p.Add(entry(i))
	}
	wantVictim(t, p, 0)
	p.Remove(key(0)) // evicted from small, used once: a ghost
	if !p.ghost.has(key(0)) {
		t.Fatal("a block evicted from small left no ghost")
	}
	p.Add(entry(0)) // used again: straight to main
	if n := p.items[key(0)]; n.queue != inMain {
		t.Fatalf("a ghost hit went to queue %d, want main", n.queue)
	}
	if p.ghost.has(key(0)) {
		t.Fatal("the ghost stayed after its block came back")
	}
}

func TestS3FIFOMainReinsertsABlockUsedAgain(t *testing.T) {
	p := NewS3FIFO()
	// Blocks 0..9 reach main through the ghost queue, oldest first.
	for i := range 10 {
		p.Add(entry(i))
		p.Remove(key(i))
		p.Add(entry(i))
	}
	p.Touch(key(0))
	p.Touch(key(0))
	// The main queue's oldest, 0, was used: reinserted (frequency 2 → 1);
	// 1 goes.
	wantVictim(t, p, 1)
	if n := p.items[key(0)]; n.freq != 1 {
		t.Fatalf("block 0 frequency %d after one reinsertion, want 1", n.freq)
	}
	wantDrain(t, p, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0)
}

func TestS3FIFOGhostQueueIsBoundedByTheBlocksHeld(t *testing.T) {
	p := NewS3FIFO()
	fillEvicting(t, p, 200, 0, 10_000)
	if n := len(p.ghost.seq); n > ghostsPerBlock*200 {
		t.Fatalf("%d ghosts with 200 blocks held", n)
	}
	if n := len(p.ghost.ring); n > 4*ghostsPerBlock*200+64 {
		t.Fatalf("ghost ring of %d slots with 200 blocks held", n)
	}
}

func TestWTinyLFUAdmitsAWindowBlockOnlyIfUsedMoreOften(t *testing.T) {
	p := NewWTinyLFU()
	fillEvicting(t, p, 100, 0, 100)
	// Seen before, while not held: the sketch remembers it.
	p.sketch.Increment(key(500))
	p.sketch.Increment(key(500))
	p.Add(entry(500)) // the window now exceeds its share by one
	v, _ := p.Victim(nil)
	if v == key(500) {
		t.Fatal("a block seen three times lost to a block seen once")
	}
	p.Remove(v)
	p.Add(entry(501)) // seen once: pushes 500 out of the window
	v, _ = p.Victim(nil)
	if v == key(500) {
		t.Fatalf("block 500 evicted; the window's oldest used once (%v) should go", v)
	}
}

func TestSketchCountsUpToSixteenAndForgetsByHalving(t *testing.T) {
	s := NewSketch(16)
	if got := s.Estimate(key(1)); got != 0 {
		t.Fatalf("an unseen key estimates %d, want 0", got)
	}
	s.Increment(key(1))
	if got := s.Estimate(key(1)); got != 1 {
		t.Fatalf("seen once (held by the doorkeeper): %d, want 1", got)
	}
	for range 30 {
		s.Increment(key(1))
	}
	if got := s.Estimate(key(1)); got != 16 {
		t.Fatalf("seen 31 times: %d, want the 4-bit cap 15 plus the doorkeeper's 1", got)
	}
	s.halve()
	if got := s.Estimate(key(1)); got != 7 {
		t.Fatalf("after halving: %d, want 15/2 = 7 (the doorkeeper is cleared)", got)
	}
	// Halving happens by itself after 10 × width increments.
	s = NewSketch(16)
	for range 10 {
		s.Increment(key(2))
	}
	before := s.Estimate(key(2))
	for i := range 10*16 - 10 {
		s.Increment(key(1000 + i))
	}
	if after := s.Estimate(key(2)); after >= before {
		t.Fatalf("estimate %d after 10 × width increments, %d before: no halving", after, before)
	}
}

func TestNewKnowsTheFrequencyPolicies(t *testing.T) {
	for _, name := range []string{"s3fifo", "wtinylfu", "s3fifo-prefix", "wtinylfu-prefix", "arc", "arc-prefix", "lhd"} {
		p, err := New(name)
		if err != nil || p.Name() != name || !Valid(name) {
			t.Fatalf("New(%q) = %v, %v", name, p, err)
		}
	}
	if _, err := New("mru"); err == nil || !strings.Contains(err.Error(), "s3fifo") {
		t.Fatalf("New of an unknown policy: %v, want an error listing the known ones", err)
	}
}

func BenchmarkSketch(b *testing.B) {
	s := NewSketch(1 << 14)
	for i := range b.N {
		s.Increment(key(i & 0xFFFFF))
		s.Estimate(key(i & 0xFFFF))
	}
}

func TestS3FIFOPrefixEvictsTheLeavesOfAChainBeforeItsRoot(t *testing.T) {
	p := NewS3FIFOPrefix()
	p.Add(entry(0))
	for i := 1; i < 5; i++ { // one chain 0 → 1 → … → 4, root first
		p.Add(child(i, i-1))
	}
	p.Add(entry(9)) // an unrelated block, newer than the whole chain
	// Plain S3-FIFO would evict 0, the oldest, stranding 1–4. The
	// prefix-aware form takes the leaf 4, having moved 0–3 to the head
	// behind 9; then 9, then the chain leaf by leaf.
	wantDrain(t, p, 4, 9, 3, 2, 1, 0)
}

func TestS3FIFOPrefixFallsBackWhenSkipLeavesNoLeaf(t *testing.T) {
	p := NewS3FIFOPrefix()
	p.Add(entry(0))
	p.Add(child(1, 0))
	wantVictimSkip(t, p, func(k index.Key) bool { return k == key(1) }, 0)
}

// BenchmarkPolicyMemory reports each policy's heap per held block (the
// "bytes/block" metric): 1<<16 blocks in chains of eight, then a churn of
// five times as many through a full policy so that ghosts and sketches
// fill.
func BenchmarkPolicyMemory(b *testing.B) {
	const n = 1 << 16
	for _, pc := range policies {
		b.Run(pc.name, func(b *testing.B) {
			var perBlock float64
			for range b.N {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				p := pc.new()
				for i := range 6 * n {
					e := entry(i)
					if i%8 != 0 {
						e = child(i, i-1)
					}
					if p.Len() >= n {
						v, _ := p.Victim(nil)
						p.Remove(v)
					}
					p.Add(e)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perBlock = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(p)
			}
			b.ReportMetric(perBlock, "bytes/block")
		})
	}
}

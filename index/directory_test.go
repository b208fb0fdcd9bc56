package index

import (
	"fmt"
	"sync"
	"testing"
)

var (
	node1DRAM = Location{Node: 1, Tier: TierDRAM}
	node1SSD  = Location{Node: 1, Tier: TierSSD}
	node2DRAM = Location{Node: 2, Tier: TierDRAM}
	s3        = Location{Node: AnyNode, Tier: TierS3}
)

const ns NamespaceID = 42

func chain(n int) []Hash {
	h := make([]Hash, n)
	for i := range h {
		h[i] = Hash(1000 + i)
	}
	return h
}

// put records blocks [from, to) of c at loc.
func put(d *Directory, c []Hash, from, to int, loc Location) {
	for i := from; i < to; i++ {
		m := Meta{Size: 4096}
		if i > 0 {
			m.Parent, m.HasParent = c[i-1], true
		}
		d.Add(Key{ns, c[i]}, m, loc)
	}
}

func TestLookupStopsAtFirstMissingBlock(t *testing.T) {
	d := NewDirectory()
	c := chain(10)
	put(d, c, 0, 4, node1DRAM)
	put(d, c, 5, 10, node1DRAM) // block 4 missing everywhere
	p := d.Lookup(ns, c, nil)
	if p.Blocks != 4 {
		t.Fatalf("prefix = %d blocks, want 4 (stop at the hole)", p.Blocks)
	}
	if got := p.At(node1DRAM); got != 4 {
		t.Fatalf("node1/dram holds %d leading blocks, want 4", got)
	}
}

func TestLookupCountsLeadingBlocksPerLocation(t *testing.T) {
	d := NewDirectory()
	c := chain(8)
	put(d, c, 0, 8, s3)        // everything in S3
	put(d, c, 0, 6, node1SSD)  // 6 on node 1's SSD
	put(d, c, 0, 2, node1DRAM) // 2 promoted to DRAM
	put(d, c, 3, 8, node2DRAM) // node 2 lacks block 0: holds no prefix
	p := d.Lookup(ns, c, nil)
	if p.Blocks != 8 {
		t.Fatalf("prefix = %d, want 8", p.Blocks)
	}
	want := []LocationBlocks{{s3, 8}, {node1SSD, 6}, {node1DRAM, 2}}
	if fmt.Sprint(p.ByLocation) != fmt.Sprint(want) {
		t.Fatalf("ByLocation = %v, want %v", p.ByLocation, want)
	}
	if p.At(node2DRAM) != 0 {
		t.Fatalf("node2 counted though it lacks block 0")
	}
}

func TestLookupAcrossLocationsJoinsPieces(t *testing.T) {
	// Blocks 0-2 on one location, 3-5 on another: the prefix is 6 even
	// though no single location holds more than 3.
	d := NewDirectory()
	c := chain(6)
	put(d, c, 0, 3, node1DRAM)
	put(d, c, 3, 6, node1SSD)
	p := d.Lookup(ns, c, nil)
	if p.Blocks != 6 || p.At(node1DRAM) != 3 || p.At(node1SSD) != 0 {
		t.Fatalf("got %+v", p)
	}
}

func TestLookupIgnoresUnusableLocations(t *testing.T) {
	d := NewDirectory()
	c := chain(4)
	put(d, c, 0, 4, node2DRAM)
	put(d, c, 0, 2, node1DRAM)
	down := func(l Location) bool { return l.Node != 2 }
	p := d.Lookup(ns, c, down)
	if p.Blocks != 2 || p.At(node2DRAM) != 0 {
		t.Fatalf("node 2 is down, got %+v", p)
	}
}

func TestNamespacesDoNotMix(t *testing.T) {
	d := NewDirectory()
	c := chain(3)
	put(d, c, 0, 3, node1DRAM)
	if p := d.Lookup(ns+1, c, nil); p.Blocks != 0 {
		t.Fatalf("other namespace found %d blocks", p.Blocks)
	}
}

func TestRemoveAndDropNode(t *testing.T) {
	d := NewDirectory()
	c := chain(4)
	put(d, c, 0, 4, node1DRAM)
	put(d, c, 0, 4, node2DRAM)
	if !d.Remove(Key{ns, c[1]}, node1DRAM) || d.Remove(Key{ns, c[1]}, node1DRAM) {
		t.Fatal("Remove should succeed once")
	}
	if p := d.Lookup(ns, c, nil); p.At(node1DRAM) != 1 || p.At(node2DRAM) != 4 {
		t.Fatalf("after remove: %+v", p)
	}
	if n := d.DropNode(2); n != 4 {
		t.Fatalf("DropNode removed %d, want 4", n)
	}
	if d.Len() != 3 {
		t.Fatalf("Len = %d, want 3 (block 1 is held nowhere now)", d.Len())
	}
	e, ok := d.Get(Key{ns, c[2]})
	if !ok || !e.HasParent || e.Parent != c[1] || e.Size != 4096 || len(e.Locations) != 1 {
		t.Fatalf("Get = %+v %v", e, ok)
	}
}

func TestDirectoryConcurrentUse(t *testing.T) {
	d := NewDirectory()
	c := chain(256)
	var wg sync.WaitGroup
	for w := range 4 {
		loc := Location{Node: NodeID(w + 1), Tier: TierDRAM}
		wg.Go(func() {
			for range 50 {
				put(d, c, 0, len(c), loc)
				for i := len(c) - 1; i >= 0; i-- {
					d.Remove(Key{ns, c[i]}, loc)
				}
			}
		})
		wg.Go(func() {
			for range 200 {
				p := d.Lookup(ns, c, nil)
				for _, lb := range p.ByLocation {
					if lb.Blocks > p.Blocks {
						t.Errorf("location %v holds %d > prefix %d", lb.Location, lb.Blocks, p.Blocks)
					}
				}
			}
		})
	}
	wg.Wait()
	if d.Len() != 0 {
		t.Fatalf("Len = %d after every writer removed its blocks", d.Len())
	}
}

func TestParseTierKind(t *testing.T) {
	for _, k := range []TierKind{TierHBM, TierDRAM, TierSSD, TierS3} {
		got, err := ParseTierKind(k.String())
		if err != nil || got != k {
			t.Fatalf("round trip of %v: %v %v", k, got, err)
		}
	}
	if _, err := ParseTierKind("tape"); err == nil {
		t.Fatal("unknown tier accepted")
	}
}

func BenchmarkLookup256(b *testing.B) {
	d := NewDirectory()
	c := chain(256)
	put(d, c, 0, 256, node1DRAM)
	put(d, c, 0, 256, node1SSD)
	b.ReportAllocs()
	for b.Loop() {
		if p := d.Lookup(ns, c, nil); p.Blocks != 256 {
			b.Fatal(p.Blocks)
		}
	}
}

func TestSnapshotIsUnaffectedByLaterChanges(t *testing.T) {
	d := NewDirectory()
	c := chain(100)
	put(d, c, 0, 100, node1DRAM)
	snap := d.Snapshot()
	put(d, c, 0, 100, node2DRAM) // changes every entry
	for i := range 50 {
		d.Remove(Key{ns, c[i]}, node1DRAM)
	}
	d.DropNode(2)
	if snap.Len() != 100 {
		t.Fatalf("snapshot has %d keys, want 100", snap.Len())
	}
	snap.Range(func(k Key, e *Entry) bool {
		if len(e.Locations) != 1 || e.Locations[0] != node1DRAM {
			t.Fatalf("snapshot entry %v changed: %v", k, e.Locations)
		}
		return true
	})
	if d.Len() != 50 {
		t.Fatalf("live directory has %d keys, want 50", d.Len())
	}
}

func BenchmarkAdd(b *testing.B) {
	d := NewDirectory()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d.Add(Key{ns, Hash(i)}, Meta{Size: 4096}, node1DRAM)
		i++
	}
}

package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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

// randomChanges returns n changes over a few keys, nodes and tiers, so
// that many of them touch the same key, with a node drop now and then.
func randomChanges(rng *rand.Rand, n int) []Change {
	cs := make([]Change, n)
	for i := range cs {
		c := Change{
			Kind: ChangeStored,
			Key:  Key{NS: ns, Hash: Hash(rng.IntN(200))},
			Meta: Meta{Size: uint32(rng.IntN(3)) * 4096, HasParent: rng.IntN(2) == 0, Parent: Hash(rng.IntN(200))},
			Loc:  Location{Node: NodeID(rng.IntN(4)), Tier: TierKind(1 + rng.IntN(4))},
		}
		switch r := rng.IntN(100); {
		case r < 2:
			c.Kind = ChangeNodeDropped
		case r < 40:
			c.Kind = ChangeRemoved
		}
		cs[i] = c
	}
	return cs
}

// applyOneByOne applies cs with single calls, the meaning of ApplyBatch.
func applyOneByOne(d *Directory, cs []Change) {
	for _, c := range cs {
		switch c.Kind {
		case ChangeStored:
			d.Add(c.Key, c.Meta, c.Loc)
		case ChangeRemoved:
			d.Remove(c.Key, c.Loc)
		case ChangeNodeDropped:
			d.DropNode(c.Loc.Node)
		}
	}
}

// dump lists every entry of d, locations in order, keys sorted.
func dump(d *Directory) string {
	var lines []string
	d.Range(func(k Key, e Entry) bool {
		lines = append(lines, fmt.Sprintf("%v %+v %v", k, e.Meta, e.Locations))
		return true
	})
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func TestApplyBatchEndsAsSingleCallsInOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		cs := randomChanges(rng, 1+rng.IntN(3000))
		batched, single := NewDirectory(), NewDirectory()
		// Start from a shared state, taken by a snapshot, so that copy on
		// write is exercised too.
		pre := randomChanges(rng, 500)
		applyOneByOne(batched, pre)
		applyOneByOne(single, pre)
		snap := batched.Snapshot()
		before := snap.Len()
		batched.ApplyBatch(cs)
		applyOneByOne(single, cs)
		if got, want := dump(batched), dump(single); got != want {
			t.Fatalf("round %d: ApplyBatch of %d changes differs from single calls:\n%s\nwant\n%s", round, len(cs), got, want)
		}
		if snap.Len() != before {
			t.Fatalf("round %d: ApplyBatch changed a snapshot", round)
		}
	}
}

func TestApplyOfEachChangeEndsAsSingleCalls(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cs := randomChanges(rng, 2000)
	applied, single := NewDirectory(), NewDirectory()
	for _, c := range cs {
		applied.Apply(c)
	}
	applyOneByOne(single, cs)
	if got, want := dump(applied), dump(single); got != want {
		t.Fatalf("Apply of %d changes differs from single calls:\n%s\nwant\n%s", len(cs), got, want)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Apply accepted a change of kind 9")
		}
	}()
	applied.Apply(Change{Kind: 9})
}

func TestApplyBatchKeepsTheOrderOfOneKey(t *testing.T) {
	d := NewDirectory()
	k := Key{NS: ns, Hash: 7}
	var cs []Change
	// Enough other keys to make ApplyBatch sort by shard.
	for i := range 100 {
		cs = append(cs, Change{Kind: ChangeStored, Key: Key{NS: ns, Hash: Hash(1000 + i)}, Loc: node1DRAM})
	}
	cs = append(cs,
		Change{Kind: ChangeStored, Key: k, Meta: Meta{Size: 1}, Loc: node1DRAM},
		Change{Kind: ChangeRemoved, Key: k, Loc: node1DRAM},
		Change{Kind: ChangeStored, Key: k, Meta: Meta{Size: 2}, Loc: node2DRAM},
		Change{Kind: ChangeNodeDropped, Loc: Location{Node: 1}},
		Change{Kind: ChangeStored, Key: k, Meta: Meta{Size: 3}, Loc: node1SSD},
	)
	d.ApplyBatch(cs)
	e, ok := d.Get(k)
	if !ok || e.Size != 3 || fmt.Sprint(e.Locations) != fmt.Sprint([]Location{node2DRAM, node1SSD}) {
		t.Fatalf("Get = %+v %v, want size 3 at node2/dram and node1/ssd", e, ok)
	}
	if d.Len() != 1 {
		t.Fatalf("Len = %d, want 1: node 1 was dropped after its 100 blocks", d.Len())
	}
}

func TestApplyBatchRejectsUnknownKindBeforeChangingAnything(t *testing.T) {
	d := NewDirectory()
	defer func() {
		if recover() == nil {
			t.Fatal("ApplyBatch accepted a change of kind 9")
		}
		if d.Len() != 0 {
			t.Fatalf("ApplyBatch changed %d keys before panicking", d.Len())
		}
	}()
	d.ApplyBatch([]Change{{Kind: ChangeStored, Key: Key{ns, 1}, Loc: node1DRAM}, {Kind: 9}})
}

func TestAddOfAnUnchangedEntryKeepsItsSnapshotShared(t *testing.T) {
	d := NewDirectory()
	put(d, chain(3), 0, 3, node1DRAM)
	snap := d.Snapshot()
	put(d, chain(3), 0, 3, node1DRAM) // nothing changes
	for i := range d.shards {
		if !d.shards[i].frozen {
			t.Fatalf("shard %d was copied by an Add that changed nothing", i)
		}
	}
	_ = snap
}

// steadyChanges fills cs with the next changes of a steady workload from
// change number n on: every other change stores a new block, the others
// remove the block stored 64 Ki changes before, so the directory keeps
// about 32 Ki blocks.
func steadyChanges(cs []Change, n int) int {
	const window = 1 << 16
	for i := range cs {
		h := Hash(uint64(n/2) * 0x9e3779b97f4a7c15)
		cs[i] = Change{Kind: ChangeStored, Key: Key{ns, h}, Meta: Meta{Size: 4096}, Loc: node1DRAM}
		if n%2 == 1 {
			cs[i] = Change{Kind: ChangeRemoved, Key: Key{ns, Hash(uint64(n/2-window/2) * 0x9e3779b97f4a7c15)}, Loc: node1DRAM}
		}
		n++
	}
	return n
}

func BenchmarkApplyBatch1024(b *testing.B) {
	d := NewDirectory()
	cs := make([]Change, 1024)
	n := 0
	for range 64 {
		n = steadyChanges(cs, n)
		d.ApplyBatch(cs)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		n = steadyChanges(cs, n)
		b.StartTimer()
		d.ApplyBatch(cs)
	}
	b.ReportMetric(float64(b.N*len(cs))/b.Elapsed().Seconds(), "changes/s")
}

func BenchmarkSingleCalls1024(b *testing.B) {
	d := NewDirectory()
	cs := make([]Change, 1024)
	n := 0
	for range 64 {
		n = steadyChanges(cs, n)
		applyOneByOne(d, cs)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		n = steadyChanges(cs, n)
		b.StartTimer()
		applyOneByOne(d, cs)
	}
	b.ReportMetric(float64(b.N*len(cs))/b.Elapsed().Seconds(), "changes/s")
}

// Lists is true exactly when a stored change would leave the entry as it
// is: the key listed at the location, with the same metadata.
func TestListsTellsWhetherAStoreWouldChangeTheEntry(t *testing.T) {
	d := NewDirectory()
	k := Key{ns, 7}
	m := Meta{Size: 4096}
	if d.Lists(k, m, node1DRAM) {
		t.Fatal("an empty directory lists a key")
	}
	d.Add(k, m, node1DRAM)
	if !d.Lists(k, m, node1DRAM) {
		t.Fatal("a key just added is not listed")
	}
	for _, c := range []struct {
		name string
		meta Meta
		loc  Location
	}{
		{"another size", Meta{Size: 4095}, node1DRAM},
		{"a parent", Meta{Size: 4096, HasParent: true, Parent: 3}, node1DRAM},
		{"another node", m, node2DRAM},
		{"another tier", m, Location{Node: 1, Tier: TierSSD}},
	} {
		if d.Lists(k, c.meta, c.loc) {
			t.Errorf("%s: listed", c.name)
		}
	}
	d.Add(k, m, node2DRAM)
	d.Remove(k, node1DRAM)
	if d.Lists(k, m, node1DRAM) || !d.Lists(k, m, node2DRAM) {
		t.Fatal("after a remove, the listing does not follow")
	}
}

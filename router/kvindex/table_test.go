package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// The table agrees with a Go map through inserts, removals (tombstones)
// and resizes, and tells every move of an entry to its owner.
func TestTableAgreesWithMap(t *testing.T) {
	tab := newTable()
	want := map[index.Hash]uint32{}
	pos := map[uint32]int{} // slot → position, as the owner keeps it
	r := rand.New(rand.NewPCG(5, 6))
	moved := func(s uint32, p int) { pos[s] = p }
	keys := make([]index.Hash, 0, 5000)
	for i := range 200000 {
		switch {
		case len(keys) == 0 || r.IntN(3) != 0:
			h := index.Hash(r.Uint64N(20000)) // small keys: runs of neighbours
			if _, ok := want[h]; ok {
				continue
			}
			s := uint32(i)
			want[h] = s
			pos[s] = tab.insert(h, s, uint64(s), moved)
			keys = append(keys, h)
		default:
			j := r.IntN(len(keys))
			h := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			s := want[h]
			if p := tab.find(h); p != pos[s] {
				t.Fatalf("find(%v) = %d, its owner has %d", h, p, pos[s])
			}
			tab.remove(pos[s])
			delete(want, h)
			delete(pos, s)
		}
	}
	if tab.n != len(want) {
		t.Fatalf("table holds %d, want %d", tab.n, len(want))
	}
	for h, s := range want {
		p := tab.find(h)
		if p < 0 || p != pos[s] || tab.ents[p].slot != s || tab.ents[p].row0 != uint64(s) {
			t.Fatalf("key %v: position %d (owner %d)", h, p, pos[s])
		}
	}
	for h := range index.Hash(20000) {
		if _, ok := want[h]; !ok && tab.find(h) >= 0 {
			t.Fatalf("removed or never inserted key %v found", h)
		}
	}
	if 4*(tab.n+tab.dead) > 3*len(tab.ents) {
		t.Fatalf("load %d+%d of %d above 3/4", tab.n, tab.dead, len(tab.ents))
	}
}

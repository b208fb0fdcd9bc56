package sim

import (
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

func TestAGhostTierGivesBackTheHeaderItWasGiven(t *testing.T) {
	g := NewGhostTier(3)
	var puts []index.Header
	for i, size := range []uint32{1, 2} {
		m := index.Header{Key: index.Key{NS: 5, Hash: index.Hash(10 + i)}, Sum: uint64(1000 + i)}
		m.Size = size
		if i > 0 {
			m.Parent, m.HasParent = puts[i-1].Key.Hash, true
		}
		if err := g.Put(m, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		puts = append(puts, m)
	}
	for _, m := range puts {
		got, err := g.Stat(m.Key)
		if err != nil || got != m {
			t.Fatalf("Stat(%v) = %+v, %v; want %+v", m.Key, got, err, m)
		}
		b, got, err := g.Get(m.Key, nil)
		if err != nil || got != m || len(b) != int(m.Size) {
			t.Fatalf("Get(%v) = %d bytes, %+v, %v; want %d bytes, %+v", m.Key, len(b), got, err, m.Size, m)
		}
	}
	if st := g.Stats(); st.Used != 3 || st.Blocks != 2 {
		t.Fatalf("stats %+v, want 3 units in 2 blocks", st)
	}
	extra := index.Header{Key: index.Key{NS: 5, Hash: 99}}
	extra.Size = 1
	if err := g.Put(extra, []byte{0}); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("a put past the capacity: %v, want ErrFull", err)
	}
	if err := g.Delete(puts[1].Key); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Stat(puts[1].Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat of a deleted block: %v, want ErrNotFound", err)
	}
	if st := g.Stats(); st.Used != 1 || st.Blocks != 1 {
		t.Fatalf("stats after the delete %+v, want 1 unit in 1 block", st)
	}
}

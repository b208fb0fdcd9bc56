package arena

import (
	"math/rand/v2"
	"testing"
)

func TestAllocatorCoalescesFreedNeighbours(t *testing.T) {
	a := New(10)
	x, _ := a.Alloc(3)
	y, _ := a.Alloc(3)
	z, _ := a.Alloc(4)
	if _, ok := a.Alloc(1); ok {
		t.Fatal("allocated past the end")
	}
	a.Release(x, 3)
	a.Release(z, 4)
	a.Release(y, 3)
	if len(a.byStart) != 1 || a.byStart[0] != 10 || a.free != 10 {
		t.Fatalf("free extents %v, want one of 10 pages", a.byStart)
	}
	if _, ok := a.Alloc(10); !ok {
		t.Fatal("whole range not allocatable after coalescing")
	}
}

func TestAllocatorFindsFitDespiteSmallExtentsInItsClass(t *testing.T) {
	// Many 4-page holes (class 3) and one 7-page hole (class 3 too): a
	// 6-page request must find the 7-page hole.
	a := New(1000)
	var held []uint32
	for range 60 {
		s, _ := a.Alloc(4)
		held = append(held, s)
		s, _ = a.Alloc(1) // separator keeps holes apart
		_ = s
	}
	big, _ := a.Alloc(7)
	rest, _ := a.Alloc(a.free)
	_ = rest
	for _, s := range held {
		a.Release(s, 4)
	}
	a.Release(big, 7)
	if s, ok := a.Alloc(6); !ok || s != big {
		t.Fatalf("alloc(6) = %d, %v; want the 7-page hole at %d", s, ok, big)
	}
}

func TestAllocatorRandomNeverOverlaps(t *testing.T) {
	const pages = 4096
	a := New(pages)
	owner := make([]int, pages)
	type ext struct{ s, n uint32 }
	var live []ext
	r := rand.New(rand.NewPCG(1, 2))
	for i := 1; i < 20000; i++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			j := r.IntN(len(live))
			e := live[j]
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
			for p := e.s; p < e.s+e.n; p++ {
				owner[p] = 0
			}
			a.Release(e.s, e.n)
			continue
		}
		n := uint32(1 + r.IntN(64))
		s, ok := a.Alloc(n)
		if !ok {
			continue
		}
		for p := s; p < s+n; p++ {
			if owner[p] != 0 {
				t.Fatalf("page %d given twice", p)
			}
			owner[p] = i
		}
		live = append(live, ext{s, n})
	}
	var used uint32
	for _, e := range live {
		used += e.n
	}
	if used+a.free != pages {
		t.Fatalf("used %d + free %d != %d", used, a.free, pages)
	}
}

// BenchmarkAllocator measures the steady state of a full pool: each
// iteration gives back one extent and takes one of the same size, as a
// tier replacing blocks of one model does, with a few sizes mixed in.
func BenchmarkAllocator(b *testing.B) {
	const pages = 1 << 16
	sizes := []uint32{16, 16, 16, 17, 32, 1}
	a := New(pages)
	type ext struct{ s, n uint32 }
	var live []ext
	for i := 0; ; i++ {
		n := sizes[i%len(sizes)]
		s, ok := a.Alloc(n)
		if !ok {
			break
		}
		live = append(live, ext{s, n})
	}
	i := 0
	for b.Loop() {
		e := live[i]
		a.Release(e.s, e.n)
		s, ok := a.Alloc(e.n)
		if !ok {
			b.Fatal("no room for an extent just given back")
		}
		live[i].s = s
		i = (i + 1) % len(live)
	}
}

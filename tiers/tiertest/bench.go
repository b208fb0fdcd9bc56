package tiertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// BenchSizes are the block sizes Bench runs at.
var BenchSizes = []int{4 << 10, 64 << 10, 1 << 20}

const (
	// benchBytes is how many bytes of blocks a Bench tier holds: more than
	// CPU caches, so that reads come from memory or below.
	benchBytes = 64 << 20
	// benchValues is how many distinct block contents Bench writes.
	benchValues = 16
	// benchBatch is how many blocks one GetMany of Bench reads.
	benchBatch = 16
)

// Bench benchmarks a backend the same way as every other, from a
// Benchmark function of its package:
//
//	func BenchmarkTier(b *testing.B) { tiertest.Bench(b, factory) }
//
// At each of BenchSizes it runs put/<size> (replacing Puts into a tier
// holding 64 MiB of blocks, then a Flush when the factory has one, timed:
// the bytes reached the tier's storage), get/<size> (Gets of the blocks,
// flushed first, round robin), and, where the tier has the extra,
// getmany/<size> (GetMany of 16 adjacent blocks) and view/<size> (View
// and Release). Throughput counts the bytes of the blocks put or read.
func Bench(b *testing.B, f Factory) {
	for _, size := range BenchSizes {
		n := max(benchBytes/size, benchBatch)
		capacity := int64(n+2) * (int64(size) + f.Overhead)
		set := newBenchSet(size)
		name := sizeName(size)
		b.Run("put/"+name, func(b *testing.B) {
			tr := f.open(b, capacity, int64(size))
			for i := range n {
				set.put(b, f, tr, i)
			}
			if f.Flush != nil {
				f.Flush(b, tr)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for i := range b.N {
				set.put(b, f, tr, i%n)
			}
			if f.Flush != nil {
				f.Flush(b, tr)
			}
		})

		// One tier, filled once, serves the read benchmarks of this size.
		tr := f.New(b, capacity, int64(size))
		for i := range n {
			set.put(b, f, tr, i)
		}
		if f.Flush != nil {
			f.Flush(b, tr)
		}
		b.Run("get/"+name, func(b *testing.B) {
			buf := make([]byte, 0, size)
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				v, _, err := tr.Get(set.key(i), buf[:0])
				if err != nil {
					b.Fatal(err)
				}
				buf = v
				i = (i + 1) % n
			}
		})
		if mg, ok := tr.(tiers.ManyGetter); ok {
			b.Run("getmany/"+name, func(b *testing.B) {
				keys := make([]index.Key, benchBatch)
				b.SetBytes(int64(benchBatch * size))
				first := 0
				for b.Loop() {
					for j := range keys {
						keys[j] = set.key(first + j)
					}
					err := mg.GetMany(context.Background(), keys, func(j int, v []byte, _ index.Header, err error) {
						if err != nil || len(v) != size {
							b.Errorf("block %v: %d bytes, %v", keys[j], len(v), err)
						}
					})
					if err != nil {
						b.Fatal(err)
					}
					first = (first + benchBatch) % (n - benchBatch + 1)
				}
			})
		}
		if vt, ok := tr.(tiers.Viewer); ok {
			b.Run("view/"+name, func(b *testing.B) {
				b.SetBytes(int64(size))
				i := 0
				for b.Loop() {
					v, err := vt.View(set.key(i), time.Second)
					if err != nil {
						b.Fatal(err)
					}
					if err := v.Release(); err != nil {
						b.Fatal(err)
					}
					i = (i + 1) % n
				}
			})
		}
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSet is benchValues distinct blocks of one size; block i of a
// benchmark has key i and the bytes of value i%benchValues.
type benchSet struct {
	metas []index.Header
	vals  [][]byte
}

func newBenchSet(size int) benchSet {
	var s benchSet
	for v := range benchValues {
		m, b := Block(index.Hash(v), size)
		m.Parent, m.HasParent = 0, false
		s.metas, s.vals = append(s.metas, m), append(s.vals, b)
	}
	return s
}

func (s benchSet) key(i int) index.Key { return index.Key{NS: ns, Hash: index.Hash(i + 1)} }

// put puts block i into tr. A tier that is busy (its uploads fell behind)
// is flushed and asked again.
func (s benchSet) put(b *testing.B, f Factory, tr tiers.Tier, i int) {
	m, v := s.metas[i%benchValues], s.vals[i%benchValues]
	m.Key = s.key(i)
	err := tr.Put(m, v)
	if errors.Is(err, tiers.ErrBusy) && f.Flush != nil {
		f.Flush(b, tr)
		err = tr.Put(m, v)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// sizeName names a block size for a benchmark: 4KiB, 64KiB, 1MiB.
func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

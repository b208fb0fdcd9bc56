package dram

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// workingSet is larger than any CPU cache, so every benchmark below moves
// bytes to and from memory, not cache; the memcpy baselines copy the same
// bytes between the same kind of buffers in the same run.
const workingSet = 256 << 20

var benchSizes = []int{64 << 10, 1 << 20, 4 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func benchMeta(i int, value []byte) index.Header {
	m := index.Header{Key: index.Key{NS: 1, Hash: index.Hash(i)}, Sum: 1}
	m.Size = uint32(len(value))
	return m
}

// filled returns a tier holding workingSet/size blocks of size bytes, with
// room for one more so that a replacing Put always fits.
func filled(b *testing.B, size int) (*Tier, int, []byte) {
	n := workingSet / size
	tr, err := New(Config{Capacity: int64((n + 1) * size), MaxBlockSize: int64(size)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tr.Close() })
	value := make([]byte, size)
	for i := range value {
		value[i] = byte(i)
	}
	for i := range n {
		if err := tr.Put(benchMeta(i, value), value); err != nil {
			b.Fatal(err)
		}
	}
	return tr, n, value
}

// BenchmarkDRAM compares the tier's Put and Get with plain copy() of the
// same bytes: memcpy-in copies one buffer into a rotating slot of a heap
// region as large as the tier (what Put does), memcpy-out copies a rotating
// slot into one buffer (what Get does).
func BenchmarkDRAM(b *testing.B) {
	for _, size := range benchSizes {
		n := workingSet / size
		b.Run("memcpy-in/"+sizeName(size), func(b *testing.B) {
			region, src := make([]byte, workingSet), make([]byte, size)
			copy(region, make([]byte, workingSet)) // fault the pages in
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				copy(region[i*size:(i+1)*size], src)
				i = (i + 1) % n
			}
		})
		b.Run("put/"+sizeName(size), func(b *testing.B) {
			tr, n, value := filled(b, size)
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				if err := tr.Put(benchMeta(i, value), value); err != nil {
					b.Fatal(err)
				}
				i = (i + 1) % n
			}
		})
		b.Run("memcpy-out/"+sizeName(size), func(b *testing.B) {
			region, dst := make([]byte, workingSet), make([]byte, size)
			for i := range region {
				region[i] = byte(i)
			}
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				copy(dst, region[i*size:(i+1)*size])
				i = (i + 1) % n
			}
		})
		b.Run("get/"+sizeName(size), func(b *testing.B) {
			tr, n, _ := filled(b, size)
			dst := make([]byte, 0, size)
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				if _, _, err := tr.Get(index.Key{NS: 1, Hash: index.Hash(i)}, dst[:0]); err != nil {
					b.Fatal(err)
				}
				i = (i + 1) % n
			}
		})
		b.Run("view/"+sizeName(size), func(b *testing.B) {
			tr, n, _ := filled(b, size)
			i := 0
			for b.Loop() {
				v, err := tr.View(index.Key{NS: 1, Hash: index.Hash(i)}, time.Second)
				if err != nil {
					b.Fatal(err)
				}
				_ = v.Release()
				i = (i + 1) % n
			}
		})
	}
}

// BenchmarkTier is the benchmark every backend runs (tiertest.Bench), for
// comparing tiers with one another; BenchmarkDRAM compares the tier with
// memcpy.
func BenchmarkTier(b *testing.B) { tiertest.Bench(b, factory) }

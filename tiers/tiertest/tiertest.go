// Package tiertest is the conformance suite every tiers.Tier backend passes:
// call Run from the backend's tests with a Factory that opens it.
package tiertest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Factory opens the backend under test, and says how to reach behind its
// back. Only New is required.
type Factory struct {
	// New opens an empty tier that holds at least capacity bytes of blocks
	// of up to maxBlock bytes each. The suite closes it (Close may be
	// called more than once).
	New func(tb testing.TB, capacity, maxBlock int64) tiers.Tier
	// Reopen, set for persistent tiers, closes tr and opens it again on
	// the same storage.
	Reopen func(tb testing.TB, tr tiers.Tier) tiers.Tier
	// Overhead is the most bytes of accounting a block may cost beyond its
	// size (page rounding, record headers). The suite checks that a tier
	// counts at least the block's size and at most size+Overhead.
	Overhead int64
	// Flush, set for tiers that buffer writes before they reach their
	// storage (s3 packs blocks into segments uploaded later), makes every
	// block put so far reach it. The suite flushes before it damages a
	// stored block or locates one, and Bench counts a flush into Put.
	Flush func(tb testing.TB, tr tiers.Tier)
	// Corrupt, when set, damages the stored bytes of key's block behind
	// the tier's back, as its storage could: it flips one byte of the
	// block in the place the tier reads it from (the arena, the Pebble
	// value, the S3 object). Nil skips the corruption tests.
	Corrupt func(tb testing.TB, tr tiers.Tier, key index.Key)
	// Unchecked says the tier hands out blocks without checking their
	// checksum (dram: memory is trusted). A damaged block then reads with
	// the Meta it was put with, whose Sum shows the damage to whoever
	// checks it next. A tier that checks must fail the read of a damaged
	// block with tiers.ErrCorrupt and drop the block (or not find it).
	Unchecked bool
}

const ns index.NamespaceID = 7

// Block makes a block of n deterministic pseudo-random bytes for hash h.
func Block(h index.Hash, n int) (index.Header, []byte) {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(h), uint64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	m := index.Header{Key: index.Key{NS: ns, Hash: h}, Sum: index.Checksum(b)}
	m.Size = uint32(n)
	if h > 0 {
		m.Parent, m.HasParent = h-1, true
	}
	return m, b
}

// open opens a tier with f.New and closes it when the test ends.
func (f Factory) open(tb testing.TB, capacity, maxBlock int64) tiers.Tier {
	tr := f.New(tb, capacity, maxBlock)
	tb.Cleanup(func() { _ = tr.Close() })
	return tr
}

// Run runs the suite: the Tier methods, then each optional extra (a
// subtest per extra, skipped when the backend lacks it), then corruption
// when the factory can damage blocks.
func Run(t *testing.T, f Factory) {
	open := f.open
	t.Run("PutThenGetReturnsBytesAndMeta", func(t *testing.T) {
		tr := open(t, 8<<20, 1<<20)
		for i, n := range []int{0, 1, 4095, 4096, 65536, 1 << 20} {
			m, b := Block(index.Hash(i+1), n)
			must(t, tr.Put(m, b))
			got, gm, err := tr.Get(m.Key, nil)
			must(t, err)
			if !bytes.Equal(got, b) {
				t.Fatalf("%d-byte block: bytes differ", n)
			}
			if gm != m {
				t.Fatalf("meta = %+v, want %+v", gm, m)
			}
			sm, err := tr.Stat(m.Key)
			must(t, err)
			if sm != m {
				t.Fatalf("Stat = %+v, want %+v", sm, m)
			}
		}
	})
	t.Run("GetAppendsToDst", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		m, b := Block(1, 1000)
		must(t, tr.Put(m, b))
		got, _, err := tr.Get(m.Key, []byte("head:"))
		must(t, err)
		if !bytes.Equal(got, append([]byte("head:"), b...)) {
			t.Fatal("Get did not append to dst")
		}
	})
	t.Run("MissingBlockIsNotFound", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		k := index.Key{NS: ns, Hash: 99}
		if _, _, err := tr.Get(k, nil); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("Get: %v, want ErrNotFound", err)
		}
		if _, err := tr.Stat(k); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("Stat: %v, want ErrNotFound", err)
		}
		if err := tr.Delete(k); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("Delete: %v, want ErrNotFound", err)
		}
	})
	t.Run("PutReplaces", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		m1, b1 := Block(5, 3000)
		must(t, tr.Put(m1, b1))
		m2, b2 := Block(5, 5000)
		must(t, tr.Put(m2, b2))
		got, gm, err := tr.Get(m1.Key, nil)
		must(t, err)
		if !bytes.Equal(got, b2) || gm != m2 {
			t.Fatal("second Put did not replace the first")
		}
		if s := tr.Stats(); s.Blocks != 1 || s.Used < 5000 || s.Used > 5000+f.Overhead {
			t.Fatalf("after replace: %+v", s)
		}
	})
	t.Run("DeleteFreesSpace", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		m, b := Block(1, 10000)
		must(t, tr.Put(m, b))
		must(t, tr.Delete(m.Key))
		if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
			t.Fatalf("Get after Delete: %v", err)
		}
		if s := tr.Stats(); s.Used != 0 || s.Blocks != 0 {
			t.Fatalf("after delete: %+v", s)
		}
	})
	t.Run("OversizedBlockIsRefusedAndChangesNothing", func(t *testing.T) {
		tr := open(t, 1<<20, 4096)
		m, b := Block(1, 4097)
		err := tr.Put(m, b)
		var se *tiers.SizeError
		if !errors.Is(err, tiers.ErrTooLarge) || !errors.As(err, &se) || se.Size != 4097 || se.Limit != 4096 {
			t.Fatalf("Put of 4097 bytes over a 4096 limit: %v", err)
		}
		if s := tr.Stats(); s.Used != 0 || s.Blocks != 0 {
			t.Fatalf("refused put changed stats: %+v", s)
		}
	})
	t.Run("MetaMustMatchValue", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		m, b := Block(1, 100)
		m.Size = 99
		if err := tr.Put(m, b); !errors.Is(err, tiers.ErrInvalid) {
			t.Fatalf("size mismatch: %v, want ErrInvalid", err)
		}
	})
	t.Run("CapacityIsEnforcedAndAccountedExactly", func(t *testing.T) {
		const capacity, size = 1 << 20, 64 << 10
		tr := open(t, capacity, size)
		var sum int64
		var full error
		for i := 1; i < 100; i++ {
			m, b := Block(index.Hash(i), size)
			if full = tr.Put(m, b); full != nil {
				break
			}
			sum += size
			s := tr.Stats()
			if s.Used < sum || s.Used > sum+int64(i)*f.Overhead || s.Used > s.Capacity || s.Blocks != int64(i) {
				t.Fatalf("after %d puts of %d bytes: %+v", i, size, s)
			}
		}
		if !errors.Is(full, tiers.ErrFull) {
			t.Fatalf("filling the tier: %v, want ErrFull", full)
		}
		if sum < capacity/2 {
			t.Fatalf("only %d of %d bytes fit", sum, capacity)
		}
	})
	t.Run("ScanListsEveryBlock", func(t *testing.T) {
		tr := open(t, 1<<20, 1<<16)
		want := map[index.Key]index.Header{}
		for i := 1; i <= 20; i++ {
			m, b := Block(index.Hash(i), i*100)
			must(t, tr.Put(m, b))
			want[m.Key] = m
		}
		got := map[index.Key]index.Header{}
		must(t, tr.Scan(func(m index.Header) bool { got[m.Key] = m; return true }))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("Scan saw %d blocks, want %d", len(got), len(want))
		}
		n := 0
		must(t, tr.Scan(func(index.Header) bool { n++; return n < 3 }))
		if n != 3 {
			t.Fatalf("Scan went on after fn returned false: %d calls", n)
		}
	})
	t.Run("ConcurrentUse", func(t *testing.T) {
		tr := open(t, 4<<20, 1<<16)
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				var buf []byte
				for i := range 200 {
					h := index.Hash(w*1000 + i%16)
					m, b := Block(h, 1000+i%7*1000)
					if err := tr.Put(m, b); err != nil {
						t.Error(err)
						return
					}
					got, gm, err := tr.Get(m.Key, buf[:0])
					if errors.Is(err, tiers.ErrNotFound) {
						continue // another goroutine's Delete
					}
					if err != nil {
						t.Error(err)
						return
					}
					if index.Checksum(got) != gm.Sum {
						t.Errorf("torn read of %v", m.Key)
					}
					buf = got
					if i%3 == 0 {
						_ = tr.Delete(m.Key)
					}
				}
			})
		}
		wg.Wait()
		var blocks int64
		must(t, tr.Scan(func(m index.Header) bool { blocks++; return true }))
		if s := tr.Stats(); s.Blocks != blocks {
			t.Fatalf("Stats says %d blocks, Scan finds %d", s.Blocks, blocks)
		}
	})
	t.Run("ClosedTierRefuses", func(t *testing.T) {
		tr := f.New(t, 1<<20, 1<<16)
		m, b := Block(1, 10)
		must(t, tr.Put(m, b))
		must(t, tr.Close())
		if err := tr.Put(m, b); !errors.Is(err, tiers.ErrClosed) {
			t.Fatalf("Put after Close: %v", err)
		}
		if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrClosed) {
			t.Fatalf("Get after Close: %v", err)
		}
		_ = tr.Close() // a second Close is harmless
	})
	if f.Reopen != nil {
		t.Run("ReopenKeepsBlocks", func(t *testing.T) {
			tr := f.New(t, 4<<20, 1<<20)
			var metas []index.Header
			for i := 1; i <= 10; i++ {
				m, b := Block(index.Hash(i), i*10000)
				must(t, tr.Put(m, b))
				metas = append(metas, m)
			}
			must(t, tr.Delete(metas[0].Key))
			before := tr.Stats()
			tr = f.Reopen(t, tr)
			t.Cleanup(func() { _ = tr.Close() })
			if after := tr.Stats(); after != before {
				t.Fatalf("stats before close %+v, after reopen %+v", before, after)
			}
			if _, _, err := tr.Get(metas[0].Key, nil); !errors.Is(err, tiers.ErrNotFound) {
				t.Fatalf("deleted block came back: %v", err)
			}
			for _, m := range metas[1:] {
				got, gm, err := tr.Get(m.Key, nil)
				must(t, err)
				if gm != m || index.Checksum(got) != m.Sum {
					t.Fatalf("block %v changed across reopen", m.Key)
				}
			}
		})
	}
	t.Run("Extras", func(t *testing.T) { runExtras(t, f) })
	t.Run("Corruption", func(t *testing.T) { runCorruption(t, f) })
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

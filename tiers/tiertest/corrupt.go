package tiertest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// result is what one read of a block returned: a copy of its bytes and
// its Meta, or an error.
type result struct {
	b   []byte
	m   index.Header
	err error
}

// read is one way of reading blocks: Get, or an extra (GetMany, View).
type read struct {
	name string
	need func(t *testing.T, tr tiers.Tier) // skips the test when tr lacks the extra
	fn   func(t *testing.T, tr tiers.Tier, keys []index.Key) []result
}

var reads = []read{
	{"Get", func(*testing.T, tiers.Tier) {}, func(t *testing.T, tr tiers.Tier, keys []index.Key) []result {
		out := make([]result, len(keys))
		for i, k := range keys {
			got, m, err := tr.Get(k, []byte("dst:"))
			if err == nil && !bytes.HasPrefix(got, []byte("dst:")) {
				t.Fatal("Get did not append to dst")
			}
			if err == nil {
				got = got[len("dst:"):]
			}
			out[i] = result{got, m, err}
		}
		return out
	}},
	{"GetMany", func(t *testing.T, tr tiers.Tier) { extra[tiers.ManyGetter](t, tr) }, func(t *testing.T, tr tiers.Tier, keys []index.Key) []result {
		out := make([]result, len(keys))
		calls := 0
		must(t, tr.(tiers.ManyGetter).GetMany(context.Background(), keys, func(i int, v []byte, m index.Header, err error) {
			calls++
			out[i] = result{v, m, err}
		}))
		if calls != len(keys) {
			t.Fatalf("GetMany of %d keys called fn %d times", len(keys), calls)
		}
		return out
	}},
	{"View", func(t *testing.T, tr tiers.Tier) { extra[tiers.Viewer](t, tr) }, func(t *testing.T, tr tiers.Tier, keys []index.Key) []result {
		out := make([]result, len(keys))
		for i, k := range keys {
			v, err := tr.(tiers.Viewer).View(k, time.Minute)
			if err != nil {
				out[i].err = err
				continue
			}
			out[i] = result{slices.Clone(v.Bytes()), v.Meta(), nil}
			must(t, v.Release())
		}
		return out
	}},
}

// runCorruption damages one stored block through the factory and checks,
// for Get and each read extra the tier has, that the damage never passes
// for the block's bytes: a tier that checks reports ErrCorrupt (or a miss)
// and drops the block, an unchecked one returns bytes its Meta's Sum
// gives away. The blocks next to the damaged one stay intact.
func runCorruption(t *testing.T, f Factory) {
	if f.Corrupt == nil {
		t.Skip("the factory cannot damage a stored block (Factory.Corrupt is nil)")
	}
	for _, r := range reads {
		t.Run(r.name, func(t *testing.T) {
			tr := f.open(t, 1<<20, 1<<16)
			r.need(t, tr)
			var metas []index.Header
			var blocks [][]byte
			for i := 1; i <= 3; i++ {
				m, b := Block(index.Hash(i), 5000)
				must(t, tr.Put(m, b))
				metas, blocks = append(metas, m), append(blocks, b)
			}
			if f.Flush != nil {
				f.Flush(t, tr)
			}
			m, b := metas[1], blocks[1]
			f.Corrupt(t, tr, m.Key)

			// The damaged block between its neighbours, read together:
			// a tier that reads runs of blocks at once checks each.
			keys := []index.Key{metas[0].Key, m.Key, metas[2].Key}
			res := r.fn(t, tr, keys)
			got, gm, err := res[1].b, res[1].m, res[1].err
			switch {
			case f.Unchecked:
				if err != nil {
					t.Fatalf("%s of a damaged block from a tier that does not check: %v, want its bytes", r.name, err)
				}
				if gm != m {
					t.Fatalf("%s of a damaged block: meta %+v, want the one it was put with, %+v", r.name, gm, m)
				}
				if bytes.Equal(got, b) {
					t.Fatalf("%s read the block intact: Factory.Corrupt did not damage it", r.name)
				}
				if index.Checksum(got) == gm.Sum {
					t.Fatalf("%s returned damaged bytes that pass their checksum", r.name)
				}
			case err == nil && bytes.Equal(got, b):
				t.Fatalf("%s read the block intact: Factory.Corrupt did not damage it", r.name)
			case err == nil:
				t.Fatalf("%s returned the damaged bytes of a block (meta %+v), want ErrCorrupt", r.name, gm)
			case errors.Is(err, tiers.ErrCorrupt) || errors.Is(err, tiers.ErrNotFound):
				if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
					t.Fatalf("Get of the damaged block after it was reported: %v, want ErrNotFound", err)
				}
				if _, err := tr.Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
					t.Fatalf("Stat of the damaged block after it was reported: %v, want ErrNotFound", err)
				}
				if s := tr.Stats(); s.Blocks != 2 {
					t.Fatalf("after the damaged block was dropped: %+v, want 2 blocks", s)
				}
			default:
				t.Fatalf("%s of a damaged block: %v, want ErrCorrupt", r.name, err)
			}
			for _, i := range []int{0, 2} {
				if n := res[i]; n.err != nil || n.m != metas[i] || !bytes.Equal(n.b, blocks[i]) {
					t.Fatalf("%s of block %v next to the damaged one: %+v, %v", r.name, metas[i].Key, n.m, n.err)
				}
			}
		})
	}
}

package tiers_test

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/ssd"
)

// BenchmarkMixedUnderEviction measures concurrent puts and gets of 64 KiB
// blocks, 16 goroutines a core, over a working set four times the DRAM
// level, which sits over a real SSD level: most puts find DRAM full and
// evict a victim themselves, demoting it to the SSD, while the gets read
// both levels (bench/mixed-demotion.sh in one process). put-only is the
// same with every operation a put. Run it with -mutexprofile to see where
// the hierarchy's lock is waited for.
func BenchmarkMixedUnderEviction(b *testing.B) {
	for _, c := range []struct {
		name     string
		getRatio float64
	}{{"put-only", 0}, {"90pct-get", 0.9}} {
		b.Run(c.name, func(b *testing.B) { mixedUnderEviction(b, c.getRatio) })
	}
}

func mixedUnderEviction(b *testing.B, getRatio float64) {
	const (
		size = 64 << 10
		keys = 1024
	)
	st, err := ssd.Open(ssd.Config{Dir: b.TempDir(), Capacity: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	top, err := dram.New(dram.Config{Capacity: keys / 4 * size, MaxBlockSize: size})
	if err != nil {
		b.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: top}, {Kind: index.TierSSD, Tier: st}}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	metas := make([]index.Header, keys)
	values := make([][]byte, keys)
	for i := range metas {
		values[i] = bytes.Repeat([]byte{byte(i), byte(i >> 8)}, size/2)
		metas[i] = index.Header{Key: index.Key{NS: 1, Hash: index.Hash(i + 1)}, Sum: index.Checksum(values[i])}
		metas[i].Size = size
		if err := h.Put(metas[i], values[i]); err != nil {
			b.Fatal(err)
		}
	}
	h.Settle()
	var seed atomic.Uint64
	b.SetBytes(size)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(seed.Add(1), 7))
		dst := make([]byte, 0, size)
		for pb.Next() {
			i := rng.IntN(keys)
			if rng.Float64() < getRatio {
				out, _, _, err := h.Get(metas[i].Key, dst[:0])
				if err == nil && index.Checksum(out) != metas[i].Sum {
					b.Error("get returned other bytes")
					return
				}
				continue
			}
			if err := h.Put(metas[i], values[i]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

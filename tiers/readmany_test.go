package tiers_test

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/ssd"
)

// batchCountingSSD is a real SSD tier that counts the batches and blocks
// it is asked for with GetMany.
type batchCountingSSD struct {
	*ssd.Tier
	batches, blocks atomic.Int64
}

func (s *batchCountingSSD) GetMany(ctx context.Context, keys []index.Key, fn func(int, []byte, index.Header, error)) error {
	s.batches.Add(1)
	s.blocks.Add(int64(len(keys)))
	return s.Tier.GetMany(ctx, keys, fn)
}

// ReadMany reads the blocks a chain has on an SSD level in one GetMany of
// the SSD tier, and the others from where they are.
func TestReadManyReadsAnSSDLevelInOneBatch(t *testing.T) {
	st, err := ssd.Open(ssd.Config{Dir: t.TempDir(), Capacity: 1 << 30, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s := &batchCountingSSD{Tier: st}
	h, err := tiers.New(tiers.Config{
		Inline:    true,
		NoPromote: true,
		Levels: []tiers.LevelConfig{
			{Kind: index.TierDRAM, Tier: newDRAM(t, 64)},
			{Kind: index.TierSSD, Tier: s},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	const chain = 12
	var keys []index.Key
	var want [][]byte
	for i := range chain {
		want = append(want, put(t, h, i))
		keys = append(keys, key(i))
		if i%4 != 0 { // every fourth block stays in DRAM
			if err := h.Demote(index.TierDRAM, key(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	calls := make([]int, chain)
	err = h.ReadMany(context.Background(), keys, func(i int, v []byte, m index.Header, kind index.TierKind, err error) {
		calls[i]++
		wantKind := index.TierSSD
		if i%4 == 0 {
			wantKind = index.TierDRAM
		}
		if err != nil || m.Key != keys[i] || kind != wantKind || !bytes.Equal(v, want[i]) {
			t.Errorf("block %d: %d bytes from %v, %v; want it from %v", i, len(v), kind, err, wantKind)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range calls {
		if n != 1 {
			t.Fatalf("fn called %d times for block %d", n, i)
		}
	}
	if b, n := s.batches.Load(), s.blocks.Load(); b != 1 || n != chain-chain/4 {
		t.Fatalf("the SSD was asked for %d blocks in %d GetMany calls, want %d in 1", n, b, chain-chain/4)
	}
}

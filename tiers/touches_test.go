package tiers_test

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// spyPolicy is an LRU that records the keys it is touched with.
type spyPolicy struct {
	policy.Policy
	mu      sync.Mutex
	touched []index.Key
}

func (p *spyPolicy) Touch(key index.Key) bool {
	p.mu.Lock()
	p.touched = append(p.touched, key)
	p.mu.Unlock()
	return p.Policy.Touch(key)
}

func (p *spyPolicy) touches() []index.Key {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.touched)
}

func spiedDRAM(t *testing.T, blocks int) (*tiers.Hierarchy, *spyPolicy) {
	t.Helper()
	spy := &spyPolicy{Policy: policy.NewLRU()}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, blocks), Policy: spy, HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, spy
}

func TestAGetLeavesThePolicyToTheNextWriter(t *testing.T) {
	h, spy := spiedDRAM(t, 8)
	put(t, h, 1)
	put(t, h, 2)
	if _, _, _, err := h.Get(key(1), nil); err != nil {
		t.Fatal(err)
	}
	if got := spy.touches(); len(got) != 0 {
		t.Fatalf("the get touched the policy itself (%v): it held the hierarchy's lock exclusively", got)
	}
	put(t, h, 3) // the next writer applies the get's touch first
	if got := spy.touches(); !slices.Equal(got, []index.Key{key(1)}) {
		t.Fatalf("after the next put the policy was touched with %v, want [%v]", got, key(1))
	}
	if s := h.Stats(); s.Gets != 1 || s.Levels[0].Hits != 1 {
		t.Errorf("gets %d, DRAM hits %d; want 1 and 1", s.Gets, s.Levels[0].Hits)
	}
}

func TestBufferedTouchesReachThePolicyInTheOrderOfTheGets(t *testing.T) {
	// 200 gets, more than a stripe of the buffer holds, spread over its
	// stripes: the policy must see them in the order they were made, and
	// evict in that order.
	const n = 200
	h, spy := spiedDRAM(t, n)
	for i := 1; i <= n; i++ {
		put(t, h, i)
	}
	order := rand.Perm(n)
	var want []index.Key
	for _, i := range order {
		if _, _, _, err := h.Get(key(i+1), nil); err != nil {
			t.Fatal(err)
		}
		want = append(want, key(i+1))
	}
	put(t, h, n+1) // applies what is left in the buffer, then evicts the least recent
	if got := spy.touches(); !slices.Equal(got, want) {
		t.Fatalf("the policy saw %d touches in another order than the %d gets:\n got %v\nwant %v", len(got), len(want), got, want)
	}
	if w := where(t, h, order[0]+1); w != "gone" {
		t.Errorf("the block read first is in %s, want evicted first", w)
	}
	if w := where(t, h, order[1]+1); w != "dram" {
		t.Errorf("the block read second is in %s, want kept", w)
	}
}

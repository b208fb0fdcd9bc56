package policy

import (
	"sort"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// recompute holds, for one prefill curve and block size, each block
// position's recompute time and the prefix sums of their inverses, so that
// a run of restored blocks costs O(log n) to credit. It grows as longer
// prompts come; the Router's lock guards it.
type recompute struct {
	curve sim.Curve
	bt    float64
	r     []float64 // r[i]: ms to recompute block i's tokens after blocks 0…i−1
	inv   []float64 // inv[i]: Σ_{j<i} 1/r[j] over r[j] > 0; len(r)+1
	mono  bool      // r is nondecreasing
}

func newRecompute(p *sim.Profile, blockTokens int) *recompute {
	return &recompute{curve: p.Prefill, bt: float64(blockTokens), inv: []float64{0}, mono: true}
}

func (t *recompute) ms(x float64) float64 {
	return float64(t.curve.At(x, 1)) / float64(time.Millisecond)
}

// grow makes r cover n blocks.
func (t *recompute) grow(n int) {
	for i := len(t.r); i < n; i++ {
		ri := t.ms(float64(i+1)*t.bt) - t.ms(float64(i)*t.bt)
		if i > 0 && ri < t.r[i-1] {
			t.mono = false
		}
		t.r = append(t.r, ri)
		s := t.inv[i]
		if ri > 0 {
			s += 1 / ri
		}
		t.inv = append(t.inv, s)
	}
}

// work is the blocks of recompute left, Σ (1 − credit_i), of n blocks
// from position a restored at c ms a block: credit_i = max(0, 1 − c/r_i),
// so each block leaves min(1, c/r_i) (all of it where r_i ≤ c).
func (t *recompute) work(a, n int, c float64) float64 {
	if n <= 0 {
		return 0
	}
	t.grow(a + n)
	if !t.mono {
		var w float64
		for i := a; i < a+n; i++ {
			if t.r[i] <= c {
				w++
			} else {
				w += c / t.r[i]
			}
		}
		return w
	}
	k := a + sort.Search(n, func(j int) bool { return t.r[a+j] > c })
	return float64(k-a) + c*(t.inv[a+n]-t.inv[k])
}

// restoreMs is the time, in ms, to restore one block of a run of n from a
// tier, or −1 when the tier earns nothing.
func restoreMs(tc TierCost, blockBytes int64, n int) float64 {
	if tc.Bandwidth <= 0 {
		return -1
	}
	s := float64(blockBytes)/tc.Bandwidth + tc.Latency.Seconds()/float64(n)
	return s * 1e3
}

// Credit is the fraction of the recompute time of the block at position
// pos that restoring it saves, in a run of n blocks from a tier costing
// tc, with blocks of blockBytes and the prefill curve of p at blockTokens
// a block: max(0, 1 − restore/recompute). It is the formula Choose uses,
// exposed for reports and tests; Choose itself uses a table.
func Credit(p *sim.Profile, blockTokens int, blockBytes int64, tc TierCost, pos, n int) float64 {
	c := restoreMs(tc, blockBytes, max(n, 1))
	if c < 0 {
		return 0
	}
	t := newRecompute(p, blockTokens)
	return 1 - t.work(pos, 1, c)
}

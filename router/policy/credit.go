package policy

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// Prefill is a prefill profile's recompute time of each block position,
// kept as a table that grows with the longest prompt seen, so that a run of
// restored blocks is credited in O(log n). A Router has one for
// Config.Profile; a worker whose profile differs gets its own through
// Candidate.Prefill. It is safe for concurrent use: share one per profile.
type Prefill struct {
	curve       sim.Curve
	blockTokens int
	mu          sync.Mutex // serializes growth
	tab         atomic.Pointer[prefillTable]
}

// prefillTable is immutable once published.
type prefillTable struct {
	r    []float64 // r[i]: ms to recompute block i's tokens after blocks 0…i−1
	inv  []float64 // inv[i]: Σ_{j<i} 1/r[j] over r[j] > 0; len(r)+1
	mono bool      // r is nondecreasing
}

// NewPrefill returns the table of profile p with blocks of blockTokens
// tokens, or an error wrapping ErrBadConfig.
func NewPrefill(p sim.Profile, blockTokens int) (*Prefill, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%w: profile: %v", ErrBadConfig, err)
	}
	if blockTokens < 1 {
		return nil, fmt.Errorf("%w: block tokens is %d, must be positive", ErrBadConfig, blockTokens)
	}
	return newPrefill(&p, blockTokens), nil
}

func newPrefill(p *sim.Profile, blockTokens int) *Prefill {
	pf := &Prefill{curve: p.Prefill, blockTokens: blockTokens}
	pf.tab.Store(&prefillTable{inv: []float64{0}, mono: true})
	return pf
}

func (p *Prefill) ms(x float64) float64 {
	return float64(p.curve.At(x, 1)) / float64(time.Millisecond)
}

// table returns a table covering at least n blocks.
func (p *Prefill) table(n int) *prefillTable {
	if t := p.tab.Load(); len(t.r) >= n {
		return t
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.tab.Load()
	if len(old.r) >= n {
		return old
	}
	n = max(n, 2*len(old.r), 256)
	t := &prefillTable{r: make([]float64, n), inv: make([]float64, n+1), mono: old.mono}
	copy(t.r, old.r)
	copy(t.inv, old.inv)
	bt := float64(p.blockTokens)
	for i := len(old.r); i < n; i++ {
		ri := p.ms(float64(i+1)*bt) - p.ms(float64(i)*bt)
		if i > 0 && ri < t.r[i-1] {
			t.mono = false
		}
		t.r[i] = ri
		t.inv[i+1] = t.inv[i]
		if ri > 0 {
			t.inv[i+1] += 1 / ri
		}
	}
	p.tab.Store(t)
	return t
}

// work is the blocks of recompute left, Σ (1 − credit_i), of n blocks
// from position a restored at c ms a block: credit_i = max(0, 1 − c/r_i),
// so each block leaves min(1, c/r_i) (all of it where r_i ≤ c).
func (p *Prefill) work(a, n int, c float64) float64 {
	if n <= 0 {
		return 0
	}
	t := p.table(a + n)
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
// exposed for reports and tests.
func Credit(p *sim.Profile, blockTokens int, blockBytes int64, tc TierCost, pos, n int) float64 {
	c := restoreMs(tc, blockBytes, max(n, 1))
	if c < 0 {
		return 0
	}
	return 1 - newPrefill(p, blockTokens).work(pos, 1, c)
}

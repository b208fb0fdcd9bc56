package policy

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
)

func defaultProfile() *sim.Profile {
	p := sim.DefaultProfile()
	return &p
}

// With the measured default bandwidths, a faster tier never earns less than
// a slower one, at any position and for runs of the lengths prompts have.
func TestCreditsAreOrderedFastestTierFirst(t *testing.T) {
	p := defaultProfile()
	def := DefaultTierCosts()
	for _, bb := range []int64{4096, 512 << 10, 2 << 20} {
		for _, pos := range []int{0, 10, 100, 1000, 6000} {
			for _, n := range []int{1, 8, 64, 512, 4096} {
				var prev float64 = 2
				for tier := range NumTiers {
					c := Credit(p, 16, bb, def[tier], pos, n)
					if c < 0 || c > 1 {
						t.Fatalf("block %d B, pos %d, run %d: %s credit %v outside [0, 1]", bb, pos, n, index.TierKind(tier+1), c)
					}
					if c > prev {
						t.Errorf("block %d B, pos %d, run %d: %s credit %v above the faster tier's %v", bb, pos, n, index.TierKind(tier+1), c, prev)
					}
					prev = c
				}
			}
		}
	}
	// With the sim model's 4 KiB blocks, a run of 64 from DRAM saves most of
	// the recompute, and even the object store, its latency shared by 64
	// blocks, saves some.
	if c := Credit(p, 16, 4096, def[index.TierDRAM-1], 0, 64); c < 0.9 {
		t.Errorf("dram credit of a 4 KiB block = %v, want ≥ 0.9", c)
	}
	if c := Credit(p, 16, 4096, def[index.TierS3-1], 0, 64); c <= 0 || c >= 1 {
		t.Errorf("s3 credit of a 4 KiB block in a run of 64 = %v, want in (0, 1)", c)
	}
}

// A tier slower than recomputing earns nothing; never a negative credit.
func TestATierSlowerThanRecomputingEarnsNothing(t *testing.T) {
	p := defaultProfile()
	slow := TierCost{Bandwidth: 1e6, Latency: time.Millisecond} // 4 ms a 4 KiB block
	for _, pos := range []int{0, 100, 1000} {
		if c := Credit(p, 16, 4096, slow, pos, 16); c != 0 {
			t.Errorf("pos %d: a 1 MB/s tier earns %v, want 0", pos, c)
		}
	}
	if c := Credit(p, 16, 4096, TierCost{Bandwidth: -1}, 0, 16); c != 0 {
		t.Errorf("a tier with negative bandwidth earns %v, want 0", c)
	}
	// Later blocks attend to more context: the same restore saves more.
	mid := TierCost{Bandwidth: 8e6, Latency: time.Microsecond} // 0.51 ms a block
	if a, b := Credit(p, 16, 4096, mid, 100, 1), Credit(p, 16, 4096, mid, 5000, 1); !(b > a) {
		t.Errorf("credit at block 5000 = %v, not above block 100's %v", b, a)
	}
}

// The credit table agrees with the per-block formula, on a convex profile
// (fast path) and on a table that is not monotone (the loop).
func TestCreditTableMatchesTheFormula(t *testing.T) {
	bumpy := &sim.Profile{Prefill: sim.Curve{Points: [][2]float64{{0, 0}, {64, 5}, {128, 6}, {1024, 100}}}}
	for _, p := range []*sim.Profile{defaultProfile(), bumpy} {
		tab := newPrefill(p, 16)
		for _, c := range []float64{0, 0.01, 0.25, 0.3, 2, 50} {
			for _, a := range []int{0, 3, 40} {
				n := 30
				var want float64
				for i := a; i < a+n; i++ {
					r := (float64(p.Prefill.At(float64(i+1)*16, 1)) - float64(p.Prefill.At(float64(i)*16, 1))) / 1e6
					if r <= c {
						want++
					} else {
						want += c / r
					}
				}
				if got := tab.work(a, n, c); math.Abs(got-want) > 1e-9*max(1, want) {
					t.Errorf("%v: work(%d, %d, %v) = %v, want %v", p.Prefill, a, n, c, got, want)
				}
			}
		}
	}
}

// The package doc's worked example.
func TestWorkedExample(t *testing.T) {
	r, err := New(Config{TieBreak: TieLowestIndex})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Tokens: 200, Blocks: 12}
	var tiers [NumTiers]int
	tiers[index.TierDRAM-1] = 8
	c := Candidate{Worker: "a", Overlap: 4, Tiers: tiers}
	nt, credited := r.newTokens(req, &c, KVTiered)
	if math.Abs(nt-11.37) > 0.01 {
		t.Errorf("new tokens = %.4f, want 11.37", nt)
	}
	if got := r.cost(knobs{weight: 1}, Load{}, nt); math.Abs(got-0.711) > 0.001 {
		t.Errorf("cost = %.4f, want 0.711", got)
	}
	if math.Abs(credited[index.TierDRAM-1]-7.79) > 0.01 {
		t.Errorf("dram credited %.4f blocks, want 7.79", credited[index.TierDRAM-1])
	}
	if c0 := Credit(r.cfg.Profile, 16, 4096, r.cfg.Tiers[index.TierDRAM-1], 4, 8); math.Abs(c0-0.9737) > 0.0001 {
		t.Errorf("credit of block 4 = %.4f, want 0.9737", c0)
	}
	tiers[index.TierDRAM-1] = 12
	cold := Candidate{Worker: "b", Tiers: tiers}
	if nt, _ := r.newTokens(req, &cold, KVTiered); math.Abs(r.cost(knobs{weight: 1}, Load{}, nt)-0.74) > 0.005 {
		t.Errorf("cost restoring all 12 blocks = %.4f, want 0.74", r.cost(knobs{weight: 1}, Load{}, nt))
	}
	if nt, _ := r.newTokens(req, &c, KVHBM); nt != 136 {
		t.Errorf("kv-hbm new tokens = %v, want 136", nt)
	}
}

func TestTierCounts(t *testing.T) {
	h, d, s, o := index.TierHBM, index.TierDRAM, index.TierSSD, index.TierS3
	locs := []index.TierKind{d, d, h, s, o, d, 0, d}
	for _, tc := range []struct {
		overlap int
		want    [NumTiers]int
	}{
		{0, [NumTiers]int{1, 3, 1, 1}},
		{3, [NumTiers]int{0, 1, 1, 1}},
		{6, [NumTiers]int{}},
		{7, [NumTiers]int{0, 1, 0, 0}},
		{9, [NumTiers]int{}},
	} {
		if got := TierCounts(locs, tc.overlap); got != tc.want {
			t.Errorf("TierCounts(overlap %d) = %v, want %v", tc.overlap, got, tc.want)
		}
	}
}

// A worker's own prefill profile decides what restoring saves there: from
// the object store, nothing on a worker with the default (fast) profile,
// most of the recompute on one ten times slower a token.
func TestTheWorkersProfileDecidesItsCredit(t *testing.T) {
	slowP := sim.Profile{Prefill: sim.Curve{Poly: []float64{16.5, 0.15, 4.2e-6}}, Decode: sim.Curve{Poly: []float64{6}}}
	slow, err := NewPrefill(slowP, 16)
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t, Config{BlockBytes: 512 << 10})
	var s3 [NumTiers]int
	s3[index.TierS3-1] = 32
	req := Request{Tokens: 512, Blocks: 32}
	fast := choose(t, r, KVTiered, req, []Candidate{{Worker: "fast", Tiers: s3}})
	slowD := choose(t, r, KVTiered, req, []Candidate{{Worker: "slow", Tiers: s3, Prefill: slow}})
	if fast.Credited[index.TierS3-1] != 0 {
		t.Errorf("fast worker credited %v blocks from s3, want 0", fast.Credited)
	}
	if c := slowD.Credited[index.TierS3-1]; c < 16 || c > 32 {
		t.Errorf("slow worker credited %v blocks of 32 from s3, want most", c)
	}
	if _, err := NewPrefill(sim.Profile{}, 16); !errors.Is(err, ErrBadConfig) {
		t.Errorf("NewPrefill of an empty profile: %v, want ErrBadConfig", err)
	}
	other, _ := NewPrefill(slowP, 32)
	if _, err := r.Choose(req, []Candidate{{Worker: "x", Prefill: other}}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a Prefill of 32-token blocks on a 16-token router: %v, want ErrBadRequest", err)
	}
}

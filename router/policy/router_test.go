package policy

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

func newRouter(t testing.TB, cfg Config) *Router {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func dram(n int) [NumTiers]int {
	var t [NumTiers]int
	t[index.TierDRAM-1] = n
	return t
}

func ptr[T any](v T) *T { return &v }

// choose routes req among cands with policy p and ends the sequence at once,
// so that repeated calls see the same load.
func choose(t testing.TB, r *Router, p Policy, req Request, cands []Candidate) Decision {
	t.Helper()
	req.Override = &Override{Policy: &p}
	d, err := r.Choose(req, cands)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	d.Seq.Done()
	return d
}

func TestParsePolicy(t *testing.T) {
	for _, p := range Policies() {
		got, err := ParsePolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %v, %v", p, got, err)
		}
	}
	_, err := ParsePolicy("kv")
	if !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("ParsePolicy(kv) = %v, want ErrUnknownPolicy", err)
	}
	for _, n := range []string{"random", "round-robin", "least-loaded", "kv-hbm", "kv-tiered"} {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not list %s", err, n)
		}
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	var c Config
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.Policy != KVTiered || c.BlockTokens != 16 || c.BlockBytes != 4096 || c.OverlapWeight != 1 ||
		c.Temperature != 0 || c.TieBreak != TieRandom || c.BusyBlockFraction != 0.95 || c.BusyPrefillTokens != 65536 ||
		c.Profile == nil || c.Tiers != DefaultTierCosts() {
		t.Errorf("defaults = %+v", c)
	}
	bad := Config{Policy: 9, BlockTokens: -1, BlockBytes: -4, OverlapWeight: -1, Temperature: math.NaN(), TieBreak: 7, BusyBlockFraction: math.Inf(1)}
	bad.Tiers[2].Latency = -1
	bad.EnsureDefaults()
	err := bad.Validate()
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("Validate = %v, want ErrBadConfig", err)
	}
	for _, f := range []string{"policy", "block tokens", "block bytes", "overlap weight", "temperature", "tie break", "busy block fraction", "tiers[ssd].latency"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
	if _, err := New(Config{Temperature: -1}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("New with temperature -1 = %v, want ErrBadConfig", err)
	}
}

// Bad input is refused and changes nothing: no sequence, no load.
func TestBadInputChangesNothing(t *testing.T) {
	r := newRouter(t, Config{})
	cands := []Candidate{{Worker: "a"}, {Worker: "b", Overlap: 2}}
	for name, tc := range map[string]struct {
		req   Request
		cands []Candidate
		want  error
	}{
		"override temperature": {Request{Tokens: 64, Blocks: 4, Override: &Override{Temperature: ptr(-1.0)}}, cands, ErrBadConfig},
		"override weight":      {Request{Tokens: 64, Blocks: 4, Override: &Override{OverlapWeight: ptr(0.0)}}, cands, ErrBadConfig},
		"override policy":      {Request{Tokens: 64, Blocks: 4, Override: &Override{Policy: ptr(Policy(42))}}, cands, ErrBadConfig},
		"blocks past tokens":   {Request{Tokens: 20, Blocks: 2}, cands, ErrBadRequest},
		"too long":             {Request{Tokens: 16 << 21, Blocks: 1 << 21}, nil, ErrBadRequest},
		"overlap past blocks":  {Request{Tokens: 16, Blocks: 1}, cands, ErrBadRequest},
		"negative tier":        {Request{Tokens: 64, Blocks: 4}, []Candidate{{Worker: "a", Tiers: [NumTiers]int{0, -1}}}, ErrBadRequest},
		"tiers past blocks":    {Request{Tokens: 64, Blocks: 4}, []Candidate{{Worker: "a", Overlap: 1, Tiers: dram(4)}}, ErrBadRequest},
		"negative load":        {Request{Tokens: 64, Blocks: 4}, []Candidate{{Worker: "a", Load: Load{PrefillTokens: -1}}}, ErrBadRequest},
	} {
		if _, err := r.Choose(tc.req, tc.cands); !errors.Is(err, tc.want) {
			t.Errorf("%s: Choose = %v, want %v", name, err, tc.want)
		}
	}
	for _, w := range []string{"a", "b"} {
		if l := r.Load(w); l != (Load{}) {
			t.Errorf("load of %s after refused requests = %+v", w, l)
		}
	}
}

// Each policy on one situation: the cache holds the prompt's first 20 of
// 32 blocks in DRAM; worker 0 holds 8 of them in its pool but is loaded,
// worker 1 holds none and is lightly loaded, worker 2 is busy (its pool
// full of active blocks) and worker 3 unhealthy.
func TestEachPolicyChooses(t *testing.T) {
	req := Request{Tokens: 520, Blocks: 32}
	cands := []Candidate{
		{Worker: "w0", Overlap: 8, Tiers: dram(12), Capacity: 1000, Load: Load{Blocks: 5}},
		{Worker: "w1", Tiers: dram(20), Capacity: 1000, Load: Load{Blocks: 1}},
		{Worker: "w2", Overlap: 20, Capacity: 100, Load: Load{Blocks: 96}},
		{Worker: "w3", Overlap: 20, Unhealthy: true},
	}
	r := newRouter(t, Config{TieBreak: TieLowestIndex})
	// kv-hbm sees only w0's 8 pooled blocks (cost 24.5 + 5 against 32.5 + 1);
	// kv-tiered knows w1 restores all 20 from DRAM nearly free (≈ 13.0 + 1
	// against ≈ 12.8 + 5).
	if d := choose(t, r, KVHBM, req, cands); d.Worker != "w0" || d.Cost != 29.5 {
		t.Errorf("kv-hbm chose %s at cost %v, want w0 at 29.5", d.Worker, d.Cost)
	}
	d := choose(t, r, KVTiered, req, cands)
	if d.Worker != "w1" || d.Cost > 14.1 || d.Credited[index.TierDRAM-1] < 19 {
		t.Errorf("kv-tiered chose %s at cost %v with %v credited, want w1 at < 14.1, ≥ 19 DRAM blocks credited", d.Worker, d.Cost, d.Credited)
	}
	if d := choose(t, r, LeastLoaded, req, cands); d.Worker != "w1" || d.Cost != 33.5 {
		t.Errorf("least-loaded chose %s at cost %v, want w1 at 33.5", d.Worker, d.Cost)
	}
	// From the object store, 20 blocks of 4 KiB cost 0.5 ms a block to
	// restore (10 ms to the first), more than the 0.24 ms they take to
	// recompute: no credit, and kv-tiered chooses as kv-hbm does.
	var s3 [NumTiers]int
	s3[index.TierS3-1] = 20
	cands[0].Tiers, cands[1].Tiers = [NumTiers]int{}, s3
	cands[0].Tiers[index.TierS3-1] = 12
	if d := choose(t, r, KVTiered, req, cands); d.Worker != "w0" || d.Cost != 29.5 || d.Credited != ([NumTiers]float64{}) {
		t.Errorf("kv-tiered with the prefix in the object store chose %s at cost %v, credited %v, want w0 at 29.5, nothing credited", d.Worker, d.Cost, d.Credited)
	}
	// Round-robin cycles over the two candidates left; random picks both.
	var rr []string
	for range 4 {
		rr = append(rr, choose(t, r, RoundRobin, req, cands).Worker)
	}
	if strings.Join(rr, " ") != "w0 w1 w0 w1" {
		t.Errorf("round-robin chose %v, want w0 w1 w0 w1", rr)
	}
	seen := map[string]int{}
	for range 200 {
		seen[choose(t, r, Random, req, cands).Worker]++
	}
	if len(seen) != 2 || seen["w0"] < 50 || seen["w1"] < 50 {
		t.Errorf("random chose %v in 200 tries, want w0 and w1 about evenly, nothing else", seen)
	}
}

// The worker holding more of the prefix wins until its load outweighs
// what the prefix saves: 20 blocks at overlap weight 1, 10 at weight 0.5.
func TestMoreCachedPrefixWinsUntilLoadOutweighsIt(t *testing.T) {
	req := Request{Tokens: 512, Blocks: 32}
	for _, w := range []float64{1, 0.5} {
		r := newRouter(t, Config{TieBreak: TieLowestIndex, OverlapWeight: w})
		gain := int(20 * w)
		for load := 0; load <= 30; load++ {
			cands := []Candidate{{Worker: "idle"}, {Worker: "cached", Overlap: 20, Load: Load{Blocks: load}}}
			want := "cached"
			if load >= gain { // at a tie the lower index, "idle", wins
				want = "idle"
			}
			if d := choose(t, r, KVHBM, req, cands); d.Worker != want {
				t.Errorf("weight %v, load %d: chose %s, want %s", w, load, d.Worker, want)
			}
		}
	}
}

// At temperature 0 the cheapest wins; equal costs go to the lowest index
// with TieLowestIndex, to any of them with TieRandom, and the same seed
// gives the same choices.
func TestTemperatureZeroIsDeterministicAndBreaksTies(t *testing.T) {
	req := Request{Tokens: 64, Blocks: 4}
	cands := []Candidate{{Worker: "a", Load: Load{Blocks: 3}}, {Worker: "b"}, {Worker: "c"}, {Worker: "d"}}
	low := newRouter(t, Config{TieBreak: TieLowestIndex})
	for range 50 {
		if d := choose(t, low, KVTiered, req, cands); d.Worker != "b" {
			t.Fatalf("TieLowestIndex chose %s, want b", d.Worker)
		}
	}
	run := func(seed uint64) []string {
		r := newRouter(t, Config{Seed: seed})
		var got []string
		for range 300 {
			got = append(got, choose(t, r, KVTiered, req, cands).Worker)
		}
		return got
	}
	a, b := run(7), run(7)
	if strings.Join(a, "") != strings.Join(b, "") {
		t.Error("the same seed gave different choices")
	}
	n := map[string]int{}
	for _, w := range a {
		n[w]++
	}
	if n["a"] != 0 || n["b"] < 50 || n["c"] < 50 || n["d"] < 50 {
		t.Errorf("TieRandom chose %v in 300 tries, want b, c, d about evenly and never a", n)
	}
	if c := run(8); strings.Join(c, "") == strings.Join(a, "") {
		t.Error("seeds 7 and 8 gave the same 300 choices")
	}
}

// At temperature τ > 0, worker w is drawn with probability proportional
// to exp(−(cost − min) / (τ · spread)).
func TestTemperatureSamplesBySoftmax(t *testing.T) {
	req := Request{Tokens: 0}
	loads := []int{0, 5, 10}
	cands := make([]Candidate, len(loads))
	for i, l := range loads {
		cands[i] = Candidate{Worker: string(rune('a' + i)), Load: Load{Blocks: l}}
	}
	for _, tau := range []float64{0.5, 1, 4} {
		r := newRouter(t, Config{Temperature: tau, Seed: 1})
		const draws = 20000
		n := make([]int, len(loads))
		for range draws {
			n[choose(t, r, LeastLoaded, req, cands).Worker[0]-'a']++
		}
		var z float64
		want := make([]float64, len(loads))
		for i, l := range loads {
			want[i] = math.Exp(-float64(l) / 10 / tau)
			z += want[i]
		}
		for i := range loads {
			p := float64(n[i]) / draws
			if math.Abs(p-want[i]/z) > 0.02 {
				t.Errorf("τ %v: worker %d drawn %.3f of the time, want %.3f ± 0.02", tau, i, p, want[i]/z)
			}
		}
	}
	// Equal costs at τ > 0: uniform.
	r := newRouter(t, Config{Temperature: 1, TieBreak: TieLowestIndex})
	n := map[string]int{}
	for range 300 {
		n[choose(t, r, LeastLoaded, req, []Candidate{{Worker: "x"}, {Worker: "y"}}).Worker]++
	}
	if n["x"] < 100 || n["y"] < 100 {
		t.Errorf("equal costs at τ 1 drew %v, want both about evenly", n)
	}
}

// Two siblings routed at once, before either reaches its first token, see
// each other's predicted prefill: the second does not pile onto the idle
// worker the first took — unless a shared cached prefix still makes that
// worker the cheaper.
func TestBurstSiblingsSeeEachOther(t *testing.T) {
	req := Request{Tokens: 512, Blocks: 32}
	r := newRouter(t, Config{TieBreak: TieLowestIndex})
	cands := []Candidate{{Worker: "a", Capacity: 1000}, {Worker: "b", Capacity: 1000}}
	d1, err := r.Choose(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := r.Choose(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if d1.Worker == d2.Worker {
		t.Errorf("siblings both went to %s", d1.Worker)
	}
	if l := r.Load(d1.Worker); l.PrefillTokens != 512 || l.Blocks != 32 || l.Prefilling != 1 {
		t.Errorf("load of %s = %+v, want 512 prefill tokens, 32 blocks, 1 prefilling", d1.Worker, l)
	}
	d1.Seq.Done()
	d2.Seq.Done()

	// Siblings sharing a 30-block prefix that worker a holds: the second
	// costs (32 + 32) / 16 + 2 on a (the first's predicted prefill and the
	// 2 blocks it adds) against 32 on b — both go to a. With only 4 blocks
	// shared, a costs (448 + 448) / 16 + 28 = 84 for the second: it goes to
	// b.
	for _, tc := range []struct {
		overlap int
		want    string
	}{{30, "a a"}, {4, "a b"}} {
		cands[0].Overlap = tc.overlap
		d1, _ = r.Choose(req, cands)
		d2, _ = r.Choose(req, cands)
		if got := d1.Worker + " " + d2.Worker; got != tc.want {
			t.Errorf("siblings sharing a %d-block prefix went to %s, want %s", tc.overlap, got, tc.want)
		}
		d1.Seq.Done()
		d2.Seq.Done()
	}
}

// A sequence counts as prefill load until its first token, as blocks until
// Done; Done is idempotent, a nil Sequence harmless, and a worker with no
// sequences left is forgotten.
func TestSequenceLifecycle(t *testing.T) {
	r := newRouter(t, Config{})
	d, err := r.Choose(Request{Tokens: 100, Blocks: 6}, []Candidate{{Worker: "w", Overlap: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Seq.Worker() != "w" || d.NewTokens != 68 {
		t.Fatalf("decision %+v, want w with 68 new tokens", d)
	}
	if l := r.Load("w"); l != (Load{PrefillTokens: 68, Blocks: 5, Prefilling: 1}) { // 7 blocks, 2 already pooled
		t.Errorf("after Choose: %+v", l)
	}
	d.Seq.FirstToken()
	d.Seq.FirstToken()
	if l := r.Load("w"); l != (Load{Blocks: 5, Decoding: 1}) {
		t.Errorf("after FirstToken: %+v", l)
	}
	d.Seq.Done()
	d.Seq.Done()
	if l := r.Load("w"); l != (Load{}) {
		t.Errorf("after Done: %+v", l)
	}
	if len(r.loads) != 0 {
		t.Errorf("the router still tracks %d workers", len(r.loads))
	}
	var nilSeq *Sequence
	nilSeq.FirstToken()
	nilSeq.Done()
	// Done before the first token (cancelled, failed) drops the prefill too.
	d, _ = r.Choose(Request{Tokens: 100, Blocks: 6}, []Candidate{{Worker: "w"}})
	d.Seq.Done()
	d.Seq.FirstToken()
	if l := r.Load("w"); l != (Load{}) {
		t.Errorf("after Done then FirstToken: %+v", l)
	}
}

// Busy and unhealthy workers are never chosen; when every healthy one is
// busy, Choose says so with ErrAllBusy, and with ErrNoWorkers when none
// is healthy.
func TestBusyAndUnhealthyWorkersAreNotCandidates(t *testing.T) {
	req := Request{Tokens: 64, Blocks: 4}
	r := newRouter(t, Config{BusyPrefillTokens: 1000})
	cands := []Candidate{
		{Worker: "full", Overlap: 4, Capacity: 100, Load: Load{Blocks: 95}},
		{Worker: "queued", Overlap: 4, Load: Load{PrefillTokens: 1000}},
		{Worker: "down", Overlap: 4, Unhealthy: true},
		{Worker: "ok", Capacity: 100, Load: Load{Blocks: 94}},
	}
	for _, p := range Policies() {
		for range 20 {
			if d := choose(t, r, p, req, cands); d.Worker != "ok" {
				t.Fatalf("%s chose %s, want ok", p, d.Worker)
			}
		}
	}
	// Busy thresholds per request: a fraction of 0.9 makes ok busy too.
	_, err := r.Choose(Request{Tokens: 64, Blocks: 4, Override: &Override{BusyBlockFraction: ptr(0.9)}}, cands)
	if !errors.Is(err, ErrAllBusy) {
		t.Errorf("every healthy worker busy: %v, want ErrAllBusy", err)
	}
	// Negative thresholds turn the checks off.
	d, err := r.Choose(Request{Tokens: 64, Blocks: 4, Override: &Override{BusyBlockFraction: ptr(-1.0), BusyPrefillTokens: ptr(-1)}}, cands[:3])
	if err != nil || d.Worker == "down" {
		t.Errorf("with the thresholds off: %v, %v", d.Worker, err)
	}
	d.Seq.Done()
	if _, err := r.Choose(req, cands[2:3]); !errors.Is(err, ErrNoWorkers) {
		t.Errorf("only unhealthy: %v, want ErrNoWorkers", err)
	}
	if _, err := r.Choose(req, nil); !errors.Is(err, ErrNoWorkers) {
		t.Errorf("no candidates: %v, want ErrNoWorkers", err)
	}
	// The tracker's own load makes a worker busy too.
	r2 := newRouter(t, Config{BusyPrefillTokens: 100})
	one := []Candidate{{Worker: "w"}}
	d, _ = r2.Choose(Request{Tokens: 160, Blocks: 10}, one)
	if _, err := r2.Choose(req, one); !errors.Is(err, ErrAllBusy) {
		t.Errorf("after 160 predicted tokens against a threshold of 100: %v, want ErrAllBusy", err)
	}
	d.Seq.FirstToken()
	if _, err := r2.Choose(req, one); err != nil {
		t.Errorf("after the first token: %v", err)
	}
}

// Many goroutines routing and ending sequences leave no load behind.
func TestConcurrentUse(t *testing.T) {
	r := newRouter(t, Config{Temperature: 0.5, BusyPrefillTokens: -1, BusyBlockFraction: -1})
	cands := []Candidate{{Worker: "a", Overlap: 3}, {Worker: "b", Tiers: dram(3)}, {Worker: "c"}}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				d, err := r.Choose(Request{Tokens: 50 + g, Blocks: 3}, cands)
				if err != nil {
					t.Error(err)
					return
				}
				if i%2 == 0 {
					d.Seq.FirstToken()
				}
				d.Seq.Done()
			}
		})
	}
	wg.Wait()
	for _, w := range []string{"a", "b", "c"} {
		if l := r.Load(w); l != (Load{}) {
			t.Errorf("load of %s = %+v after every sequence ended", w, l)
		}
	}
}

// Package configure recommends a deployment of workers for a worker (GPU)
// budget: aggregated workers or disaggregated prefill and decode pools,
// every split of the budget between the two, and batch limits. It rates
// each candidate with planner/perf, the model the planner and the
// simulation share, so the recommendation and the planner never disagree.
//
// For each candidate the highest request rate the budget serves within
// the TTFT and ITL targets, λ_max, is found by bisection on perf's Need:
// aggregated, Need.Aggregated ≤ G; disaggregated p:(G−p), Need.Prefill ≤ p
// and Need.Decode ≤ G−p. From it:
//
//	throughput per worker  = λ_max · OSL ÷ G output tokens a second
//	tokens per user        = 1 ÷ ITL, the decode step at the concurrency
//	                         perf's decode capacity runs each worker at
//
// The Pareto front over those two is what the budget can buy; the best
// configuration is the front's highest throughput per worker. Every
// candidate with λ_max > 0 meets both targets at λ_max by construction.
package configure

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// ErrBadInput marks an Input Evaluate refuses; test with errors.Is.
var ErrBadInput = errors.New("configure: bad input")

// Modes of a deployment.
const (
	Aggregated    = "aggregated"
	Disaggregated = "disaggregated"
)

// Defaults and bounds of an Input.
var (
	DefaultMaxNumSeqs          = []int{8, 16, 32, 64, 128, 256}
	DefaultMaxNumBatchedTokens = []int{1024, 2048, 4096, 8192}
)

// MaxBudget bounds Input.Budget: every split of it is evaluated.
const MaxBudget = 256

// Input is what the configurator sizes for.
type Input struct {
	Profile sim.Profile
	// KVTokens is each worker's KV pool in tokens (0: the profile's
	// worker's, else perf's default).
	KVTokens int
	// Budget is the number of workers (GPUs), G ≥ 1.
	Budget int
	// ISL and OSL are the mean prompt and output lengths, in tokens.
	ISL, OSL float64
	// Hit is the fraction of prompt tokens the cache serves, in [0, 1).
	Hit     float64
	Targets perf.Targets
	// MaxNumSeqs and MaxNumBatchedTokens are the batch limits to try
	// (nil: the defaults above). A pair whose batched tokens are fewer
	// than its sequences is skipped, as a worker refuses it.
	MaxNumSeqs, MaxNumBatchedTokens []int
}

// Point is one candidate deployment and how it does.
type Point struct {
	Mode string `json:"mode"`
	// Workers is the budget; Prefill and Decode are the pools of a
	// disaggregated deployment (0 when aggregated).
	Workers             int `json:"workers"`
	Prefill             int `json:"prefill,omitempty"`
	Decode              int `json:"decode,omitempty"`
	MaxNumSeqs          int `json:"max_num_seqs"`
	MaxNumBatchedTokens int `json:"max_num_batched_tokens"`
	// Rate is λ_max, requests a second; 0 when the targets cannot be met.
	Rate float64 `json:"rate"`
	// ThroughputPerWorker is output tokens a second per worker at Rate.
	ThroughputPerWorker float64 `json:"throughput_per_worker"`
	// TokensPerUser is one stream's output tokens a second, 1/ITL.
	TokensPerUser float64 `json:"tokens_per_user"`
	// ITLMs is the decode step at Concurrency, the sequences each decode
	// worker runs; TTFTMs is perf's expected mean TTFT at Rate.
	ITLMs       float64 `json:"itl_ms"`
	TTFTMs      float64 `json:"ttft_ms"`
	Concurrency int     `json:"concurrency"`
	// Reason says why Rate is 0: ttft-infeasible (a prompt alone takes
	// longer than the TTFT target), itl-infeasible (one sequence's step
	// is longer than the ITL target, or its KV does not fit).
	Reason string `json:"reason,omitempty"`
}

// Feasible reports whether p serves any load within the targets.
func (p Point) Feasible() bool { return p.Rate > 0 }

// String names the deployment: "aggregated 8 × (seqs 64, batched 2048)".
func (p Point) String() string {
	shape := fmt.Sprintf("aggregated %d", p.Workers)
	if p.Mode == Disaggregated {
		shape = fmt.Sprintf("disaggregated %d:%d", p.Prefill, p.Decode)
	}
	return fmt.Sprintf("%s, max_num_seqs %d, max_num_batched_tokens %d", shape, p.MaxNumSeqs, p.MaxNumBatchedTokens)
}

// Result is every candidate, the Pareto front, and the choices.
type Result struct {
	Input struct {
		Budget   int     `json:"budget"`
		ISL      float64 `json:"isl"`
		OSL      float64 `json:"osl"`
		Hit      float64 `json:"hit"`
		TTFTMs   float64 `json:"slo_ttft_ms"`
		ITLMs    float64 `json:"slo_itl_ms"`
		KVTokens int     `json:"kv_tokens"`
	} `json:"input"`
	// Points is every candidate, aggregated first.
	Points []Point `json:"points"`
	// Front is the Pareto front over throughput per worker and tokens per
	// user, by tokens per user ascending.
	Front []Point `json:"front"`
	// Best is the feasible point of highest throughput per worker (ties:
	// more tokens per user, then aggregated, then smaller limits); nil
	// when no candidate meets the targets.
	Best *Point `json:"best"`
	// BestAggregated is the best aggregated point, which a simulated
	// replay (aggregated workers only) can check.
	BestAggregated *Point `json:"best_aggregated"`
	// Rejected is an aggregated point with other batch limits that the
	// configurator ranks below BestAggregated: the feasible one of lowest
	// λ_max, or an infeasible one. Run both at BestAggregated.Rate to
	// check the ranking.
	Rejected *Point `json:"rejected"`
}

// Validate reports every problem of in at once, wrapping ErrBadInput.
func (in Input) Validate() error {
	var probs []string
	if err := in.Profile.Validate(); err != nil {
		probs = append(probs, err.Error())
	}
	if in.Budget < 1 || in.Budget > MaxBudget {
		probs = append(probs, fmt.Sprintf("budget %d: want workers in [1, %d]", in.Budget, MaxBudget))
	}
	if !(in.ISL >= 1 && in.ISL <= 1e8) {
		probs = append(probs, fmt.Sprintf("ISL %v: want prompt tokens in [1, 1e8]", in.ISL))
	}
	if !(in.OSL >= 1 && in.OSL <= 1e8) {
		probs = append(probs, fmt.Sprintf("OSL %v: want output tokens in [1, 1e8]", in.OSL))
	}
	if !(in.Hit >= 0 && in.Hit < 1) {
		probs = append(probs, fmt.Sprintf("hit %v: want a fraction in [0, 1)", in.Hit))
	}
	if in.Targets.TTFT <= 0 {
		probs = append(probs, fmt.Sprintf("TTFT target %v: want > 0", in.Targets.TTFT))
	}
	if in.Targets.ITL <= 0 {
		probs = append(probs, fmt.Sprintf("ITL target %v: want > 0", in.Targets.ITL))
	}
	if in.KVTokens < 0 {
		probs = append(probs, fmt.Sprintf("KV tokens %d: want ≥ 1 (0: the default)", in.KVTokens))
	}
	seqs, batched := in.limits()
	for _, s := range seqs {
		if s < 1 || s > 1<<16 {
			probs = append(probs, fmt.Sprintf("max_num_seqs %d: want [1, 65536]", s))
		}
	}
	for _, b := range batched {
		if b < 1 || b > 1<<24 {
			probs = append(probs, fmt.Sprintf("max_num_batched_tokens %d: want [1, 16777216]", b))
		}
	}
	if len(probs) == 0 && len(in.pairs()) == 0 {
		probs = append(probs, fmt.Sprintf("no batch limits to try: every max_num_batched_tokens in %v is below every max_num_seqs in %v", batched, seqs))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadInput, strings.Join(probs, "; "))
}

func (in Input) limits() (seqs, batched []int) {
	seqs, batched = in.MaxNumSeqs, in.MaxNumBatchedTokens
	if len(seqs) == 0 {
		seqs = DefaultMaxNumSeqs
	}
	if len(batched) == 0 {
		batched = DefaultMaxNumBatchedTokens
	}
	return seqs, batched
}

func (in Input) pairs() [][2]int {
	seqs, batched := in.limits()
	var out [][2]int
	for _, s := range seqs {
		for _, b := range batched {
			if b >= s && !slices.Contains(out, [2]int{s, b}) {
				out = append(out, [2]int{s, b})
			}
		}
	}
	return out
}

// Evaluate rates every candidate and chooses among them.
func Evaluate(in Input) (Result, error) {
	if err := in.Validate(); err != nil {
		return Result{}, err
	}
	var r Result
	r.Input.Budget, r.Input.ISL, r.Input.OSL, r.Input.Hit = in.Budget, in.ISL, in.OSL, in.Hit
	r.Input.TTFTMs, r.Input.ITLMs = ms(in.Targets.TTFT), ms(in.Targets.ITL)
	kv := in.KVTokens
	if kv == 0 && in.Profile.Worker != nil {
		kv = in.Profile.Worker.KVTokens
	}
	load := perf.Load{Rate: 1, ISL: in.ISL, OSL: in.OSL, Hit: in.Hit}
	var disagg []Point
	for _, pair := range in.pairs() {
		m, err := perf.New(in.Profile, sim.WorkerLimits{KVTokens: kv, MaxNumSeqs: pair[0], MaxNumBatchedTokens: pair[1]})
		if err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrBadInput, err)
		}
		r.Input.KVTokens = m.KVTokens
		r.Points = append(r.Points, evaluate(m, load, in, 0))
		for p := 1; p < in.Budget; p++ {
			disagg = append(disagg, evaluate(m, load, in, p))
		}
	}
	r.Points = append(r.Points, disagg...)
	r.Front = front(r.Points)
	for i, p := range r.Points {
		if !p.Feasible() {
			continue
		}
		if r.Best == nil || better(p, *r.Best) {
			r.Best = &r.Points[i]
		}
		if p.Mode == Aggregated && (r.BestAggregated == nil || better(p, *r.BestAggregated)) {
			r.BestAggregated = &r.Points[i]
		}
	}
	if r.BestAggregated != nil {
		for i, p := range r.Points {
			if p.Mode != Aggregated || (p.MaxNumSeqs == r.BestAggregated.MaxNumSeqs && p.MaxNumBatchedTokens == r.BestAggregated.MaxNumBatchedTokens) {
				continue
			}
			if r.Rejected == nil || p.Rate < r.Rejected.Rate {
				r.Rejected = &r.Points[i]
			}
		}
	}
	return r, nil
}

// better orders feasible points: more throughput per worker, then more
// tokens per user, then aggregated, then the smaller limits.
func better(a, b Point) bool {
	const eps = 1e-9
	switch {
	case a.ThroughputPerWorker > b.ThroughputPerWorker*(1+eps):
		return true
	case b.ThroughputPerWorker > a.ThroughputPerWorker*(1+eps):
		return false
	case a.TokensPerUser > b.TokensPerUser*(1+eps):
		return true
	case b.TokensPerUser > a.TokensPerUser*(1+eps):
		return false
	case a.Mode != b.Mode:
		return a.Mode == Aggregated
	case a.MaxNumSeqs != b.MaxNumSeqs:
		return a.MaxNumSeqs < b.MaxNumSeqs
	}
	return a.MaxNumBatchedTokens < b.MaxNumBatchedTokens
}

// evaluate rates one candidate: aggregated when prefill is 0, else the
// split prefill:(Budget − prefill).
func evaluate(m perf.Model, load perf.Load, in Input, prefill int) Point {
	g := in.Budget
	pt := Point{Mode: Aggregated, Workers: g, MaxNumSeqs: m.MaxSeqs, MaxNumBatchedTokens: m.MaxBatched}
	if prefill > 0 {
		pt.Mode, pt.Prefill, pt.Decode = Disaggregated, prefill, g-prefill
	}
	need := func(rate float64) perf.Need {
		l := load
		l.Rate = rate
		return m.Need(l, in.Targets, perf.Corrections{})
	}
	n1 := need(1)
	switch {
	case !n1.PrefillOK:
		pt.Reason = "ttft-infeasible"
		return pt
	case !n1.DecodeOK:
		pt.Reason = "itl-infeasible"
		return pt
	}
	fits := func(rate float64) bool {
		n := need(rate)
		if pt.Mode == Aggregated {
			return n.Aggregated <= float64(g)
		}
		return n.Prefill <= float64(pt.Prefill) && n.Decode <= float64(pt.Decode)
	}
	pt.Rate = maxRate(fits)
	_, conc, _ := m.DecodeCapacity(load.ISL+load.OSL/2, in.Targets.ITL, 1)
	step := m.DecodeStep(conc, load.ISL+load.OSL/2)
	pt.Concurrency, pt.ITLMs = conc, ms(step)
	if step > 0 {
		pt.TokensPerUser = 1 / step.Seconds()
	}
	pt.ThroughputPerWorker = pt.Rate * load.OSL / float64(g)
	// perf's expected TTFT at λ_max on the prefill workers, or, when
	// aggregated, on the share of every worker's time prefill takes
	// (ExpectedTTFT at rate/w on one worker is rate on w workers' worth).
	u := load.ISL * (1 - load.Hit)
	w := float64(pt.Prefill)
	if pt.Mode == Aggregated {
		w = float64(g)
		if n := need(pt.Rate); n.Aggregated > 0 {
			w = float64(g) * n.Prefill / n.Aggregated
		}
	}
	if w > 0 {
		pt.TTFTMs = ms(m.ExpectedTTFT(pt.Rate/w, u, 1))
	}
	return pt
}

// maxRate is the largest rate fits accepts, by doubling then bisection to
// a relative precision of 1e-9; 0 if none does.
func maxRate(fits func(float64) bool) float64 {
	hi := 1.0
	for fits(hi) {
		if hi > 1e12 {
			return hi
		}
		hi *= 2
	}
	lo := 0.0
	for hi-lo > 1e-9*hi {
		mid := (lo + hi) / 2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// front is the feasible points no other point beats on both throughput
// per worker and tokens per user, by tokens per user ascending; of equal
// points the first (better) one only.
func front(points []Point) []Point {
	var out []Point
	for i, p := range points {
		if !p.Feasible() {
			continue
		}
		dominated := false
		for j, q := range points {
			if i == j || !q.Feasible() {
				continue
			}
			geq := q.ThroughputPerWorker >= p.ThroughputPerWorker && q.TokensPerUser >= p.TokensPerUser
			gt := q.ThroughputPerWorker > p.ThroughputPerWorker || q.TokensPerUser > p.TokensPerUser
			if geq && (gt || better(q, p)) {
				dominated = true
				break
			}
		}
		if !dominated {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, func(a, b Point) int {
		switch {
		case a.TokensPerUser < b.TokensPerUser:
			return -1
		case a.TokensPerUser > b.TokensPerUser:
			return 1
		}
		return 0
	})
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

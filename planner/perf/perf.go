// Package perf is the one performance model of a worker that the planner,
// the configurator and static sizing share: how long a prompt's prefill
// takes, how long a decode step takes, and from those how many requests a
// second one worker serves within a TTFT and an ITL target.
//
// It reads a sim.Profile, the same file the sim engine replays and the
// profiler writes, so what the planner predicts is what the simulation
// does. A Model is a value; its methods are pure and safe for concurrent
// use.
package perf

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// Defaults of a Model's limits, those of engine/sched and replay/simulate.
const (
	DefaultKVTokens   = 131072
	DefaultMaxSeqs    = 256
	DefaultMaxBatched = 2048
	// DefaultMaxUtilisation caps the share of a worker's time that prefill
	// is planned to take, whatever the TTFT target allows: a queue at 90 %
	// is already long-tailed.
	DefaultMaxUtilisation = 0.9
)

// ErrBadModel marks limits New refuses.
var ErrBadModel = errors.New("perf: bad model")

// Model is a worker's performance: its profile and batch limits.
type Model struct {
	P sim.Profile
	// KVTokens is the worker's GPU KV pool in tokens. The default is
	// DefaultKVTokens.
	KVTokens int
	// MaxSeqs bounds the running batch (vLLM's max_num_seqs). The default
	// is DefaultMaxSeqs.
	MaxSeqs int
	// MaxBatched is the tokens one step computes (max_num_batched_tokens):
	// a longer prompt is prefilled in chunks of it. The default is
	// DefaultMaxBatched.
	MaxBatched int
	// MaxUtilisation caps the planned prefill utilisation, in (0, 1). The
	// default is DefaultMaxUtilisation.
	MaxUtilisation float64
}

// New is the model of a worker with profile p and limits lim; zero limits
// take the defaults above. It reports every bad field at once.
func New(p sim.Profile, lim sim.WorkerLimits) (Model, error) {
	m := Model{P: p, KVTokens: lim.KVTokens, MaxSeqs: lim.MaxNumSeqs, MaxBatched: lim.MaxNumBatchedTokens}
	m.EnsureDefaults()
	if err := m.Validate(); err != nil {
		return Model{}, err
	}
	return m, nil
}

// EnsureDefaults sets every zero field to its default.
func (m *Model) EnsureDefaults() {
	if m.KVTokens == 0 {
		m.KVTokens = DefaultKVTokens
	}
	if m.MaxSeqs == 0 {
		m.MaxSeqs = DefaultMaxSeqs
	}
	if m.MaxBatched == 0 {
		m.MaxBatched = max(DefaultMaxBatched, m.MaxSeqs)
	}
	if m.MaxUtilisation == 0 {
		m.MaxUtilisation = DefaultMaxUtilisation
	}
}

// Validate reports every problem of m in one error wrapping ErrBadModel.
func (m Model) Validate() error {
	var probs []string
	if err := m.P.Validate(); err != nil {
		probs = append(probs, err.Error())
	}
	if m.KVTokens < 1 {
		probs = append(probs, fmt.Sprintf("KV tokens is %d, must be ≥ 1", m.KVTokens))
	}
	if m.MaxSeqs < 1 {
		probs = append(probs, fmt.Sprintf("max seqs is %d, must be ≥ 1", m.MaxSeqs))
	}
	if m.MaxBatched < max(m.MaxSeqs, 1) {
		probs = append(probs, fmt.Sprintf("max batched tokens is %d, must be ≥ max seqs (%d)", m.MaxBatched, m.MaxSeqs))
	}
	if !(m.MaxUtilisation > 0 && m.MaxUtilisation < 1) {
		probs = append(probs, fmt.Sprintf("max utilisation is %v, must be in (0, 1)", m.MaxUtilisation))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadModel, strings.Join(probs, "; "))
}

// PrefillTime is how long prefilling u uncached tokens of one prompt takes
// on an otherwise idle worker: ⌈u/MaxBatched⌉ chunked steps at batch 1.
func (m Model) PrefillTime(u float64) time.Duration {
	if u <= 0 {
		return 0
	}
	b := float64(m.MaxBatched)
	full := math.Floor(u / b)
	t := time.Duration(full) * m.P.Prefill.At(b, 1)
	if rest := u - full*b; rest > 0 {
		t += m.P.Prefill.At(rest, 1)
	}
	return t
}

// DecodeStep is one decode step's time with c sequences of ctx tokens of
// context each.
func (m Model) DecodeStep(c int, ctx float64) time.Duration {
	return m.P.Decode.At(float64(c)*ctx/float64(m.KVTokens), c)
}

// PrefillCapacity is how many uncached prompt tokens a second one worker
// prefills with prompts of u uncached tokens while the mean TTFT stays
// within ttft, each prompt's service time multiplied by the correction
// corr (1 = the profile is right). A worker is an M/D/1 queue: at
// utilisation ρ a request waits ρS/(2(1−ρ)) on average, so S + wait ≤ ttft
// gives ρ* = 2(ttft − S)/(2·ttft − S), capped at MaxUtilisation. ok is
// false when a prompt alone takes longer than ttft: no number of workers
// meets the target.
func (m Model) PrefillCapacity(u float64, ttft time.Duration, corr float64) (tokPerS float64, ok bool) {
	s := corr * m.PrefillTime(u).Seconds()
	if s <= 0 {
		return math.Inf(1), true
	}
	rho, ok := m.utilisation(s, ttft.Seconds())
	if !ok {
		return 0, false
	}
	return rho * u / s, true
}

func (m Model) utilisation(s, tau float64) (float64, bool) {
	if tau <= s {
		return 0, false
	}
	return min(2*(tau-s)/(2*tau-s), m.MaxUtilisation), true
}

// PrefillCapacityQ is PrefillCapacity for a target on the q-quantile of
// TTFT rather than its mean: at most a share 1 − q of prompts may wait
// longer than ttft − S. An M/D/1 queue's wait has an exponential tail,
// P(W > t) ≈ ρ·e^(−θt), whose rate θ solves ρ(e^(θS) − 1) = θS
// (Cramér–Lundberg); the capacity is at the highest ρ whose tail at
// ttft − S is within 1 − q. q = 0 is the mean target of PrefillCapacity.
func (m Model) PrefillCapacityQ(u float64, ttft time.Duration, q, corr float64) (tokPerS float64, ok bool) {
	if q <= 0 {
		return m.PrefillCapacity(u, ttft, corr)
	}
	s := corr * m.PrefillTime(u).Seconds()
	if s <= 0 {
		return math.Inf(1), true
	}
	tau := ttft.Seconds()
	if tau <= s {
		return 0, false
	}
	tail := func(rho float64) float64 { return rho * math.Exp(-tailRate(rho)*(tau-s)/s) }
	lo, hi := 0.0, m.MaxUtilisation
	if tail(hi) <= 1-q {
		return hi * u / s, true
	}
	for range 60 {
		mid := (lo + hi) / 2
		if tail(mid) <= 1-q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo * u / s, lo > 0
}

// tailRate is x = θS > 0 with ρ(e^x − 1) = x, for ρ in (0, 1): the decay
// of an M/D/1 queue's wait in units of the service time.
func tailRate(rho float64) float64 {
	f := func(x float64) float64 { return rho*math.Expm1(x) - x }
	lo, hi := 0.0, 1.0
	for f(hi) < 0 {
		lo, hi = hi, 2*hi
	}
	if lo == 0 {
		lo = 1e-12 // f < 0 just above 0: f'(0) = ρ − 1 < 0
	}
	for range 100 {
		mid := (lo + hi) / 2
		if f(mid) < 0 {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// DecodeCapacity is how many output tokens a second one worker decodes
// with sequences of ctx tokens of context while each step, multiplied by
// the correction corr, stays within itl: the best throughput over the
// concurrencies c ≤ MaxSeqs whose KV fits the pool. conc is that c. ok is
// false when not even one sequence meets the target or fits.
func (m Model) DecodeCapacity(ctx float64, itl time.Duration, corr float64) (tokPerS float64, conc int, ok bool) {
	for c := 1; c <= m.MaxSeqs; c++ {
		if float64(c)*ctx > float64(m.KVTokens) {
			break
		}
		step := corr * m.DecodeStep(c, ctx).Seconds()
		if step > itl.Seconds() || step <= 0 {
			continue
		}
		if tp := float64(c) / step; tp > tokPerS {
			tokPerS, conc = tp, c
		}
	}
	return tokPerS, conc, conc > 0
}

// ExpectedTTFT is the mean TTFT the model expects of requests of u
// uncached tokens arriving at rate a second, spread evenly over workers:
// the prefill time plus the M/D/1 wait. It is MaxStep when the workers
// are saturated. The planner divides observed TTFT by it to correct the
// profile for its error alone, the queueing being already inside.
func (m Model) ExpectedTTFT(rate, u float64, workers int) time.Duration {
	s := m.PrefillTime(u).Seconds()
	if workers < 1 {
		return sim.MaxStep
	}
	rho := rate * s / float64(workers)
	if rho >= 1 {
		return sim.MaxStep
	}
	return time.Duration((s + rho*s/(2*(1-rho))) * float64(time.Second))
}

// Load is the traffic one sizing is for.
type Load struct {
	Rate float64 // requests a second
	ISL  float64 // mean prompt tokens
	OSL  float64 // mean output tokens
	// Hit is the fraction of prompt tokens the cache or a worker's pool
	// already holds, in [0, 1]: only the rest is prefilled.
	Hit float64
}

// Targets are the latency goals: TTFT and mean ITL. The TTFT target is on
// the mean, or with TTFTQuantile q in (0, 1) on the q-quantile: a share q
// of requests start within it.
type Targets struct {
	TTFT, ITL    time.Duration
	TTFTQuantile float64
}

// Corrections multiply the profile's prefill and decode times by what was
// observed against what it predicted; 0 is read as 1.
type Corrections struct{ Prefill, Decode float64 }

// Need is how many workers a Load needs, as fractions (the planner rounds
// up after its hysteresis), for disaggregated pools and for aggregated
// workers that do both.
type Need struct {
	Prefill, Decode, Aggregated float64
	// PrefillOK and DecodeOK are false when no number of workers meets
	// the TTFT or the ITL target: a prompt alone is too slow, or one
	// sequence's step is.
	PrefillOK, DecodeOK bool
}

// Need is the workers l needs within t:
//
//	prefill    = rate × ISL × (1 − hit) ÷ prefill capacity at the TTFT target (its mean or quantile)
//	decode     = rate × OSL ÷ decode capacity at the ITL target and context ISL + OSL/2
//	aggregated = prefill + decode, the shares of a worker's time each takes
//
// with both capacities corrected by c.
func (m Model) Need(l Load, t Targets, c Corrections) Need {
	cp, cd := c.Prefill, c.Decode
	if cp == 0 {
		cp = 1
	}
	if cd == 0 {
		cd = 1
	}
	var n Need
	u := l.ISL * (1 - min(max(l.Hit, 0), 1))
	if pc, ok := m.PrefillCapacityQ(u, t.TTFT, t.TTFTQuantile, cp); ok {
		n.PrefillOK = true
		if !math.IsInf(pc, 1) {
			n.Prefill = l.Rate * u / pc
		}
	}
	if dc, _, ok := m.DecodeCapacity(l.ISL+l.OSL/2, t.ITL, cd); ok {
		n.DecodeOK = true
		n.Decode = l.Rate * l.OSL / dc
	}
	n.Aggregated = n.Prefill + n.Decode
	return n
}

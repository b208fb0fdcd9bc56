package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/planner/perf"
)

// Constants of the loop's estimates.
const (
	// smoothing is the EWMA weight of a window's ISL, OSL, hit fraction
	// and latency corrections.
	smoothing = 0.3
	// minCorrection and maxCorrection bound the corrections: a profile
	// off by more than that is a wrong profile, not noise.
	minCorrection, maxCorrection = 0.5, 4.0
	// correctionRequests is the fewest requests in a window that update
	// a correction, and correctionMaxRho the highest model utilisation:
	// a saturated window's latency is queueing the load terms already
	// scale for.
	correctionRequests = 20
	correctionMaxRho   = 0.9
	// A window that ends with more requests waiting than backlogPerWorker
	// per worker serving is backlogged: its TTFT is the backlog's wait,
	// which the backlog term of the scale-up sizes for, not an error of
	// the profile, so it updates no correction.
	backlogPerWorker = 1.0
	// inFlightFor is how long a scale the planner asked for may take to
	// show in the connector's Desired before a different count is read
	// as a manual change.
	inFlightFor = 10 * time.Minute
)

// Reasons of a Decision.
const (
	ReasonLoad           = "load"
	ReasonIdle           = "idle"
	ReasonManual         = "manual"
	ReasonBudget         = "budget"
	ReasonTTFTInfeasible = "ttft-infeasible"
	ReasonITLInfeasible  = "itl-infeasible"
	ReasonHold           = "hold"
	ReasonCooldown       = "cooldown"
	ReasonScrapeFailed   = "scrape-failed"
)

// loop is a Planner's state between steps.
type loop struct {
	pred    predictor
	metrics *metrics
	reg     *prometheus.Registry

	seq      uint64
	isl, osl estimate
	hit      estimate
	cp, cd   float64 // corrections, 1 = the profile is right
	idle     int     // OK windows in a row without arrivals
	last     prediction
	pools    map[Pool]*poolState

	mu     sync.Mutex // guards status
	status Status
}

// estimate is an EWMA that keeps its last value through undefined windows.
type estimate struct {
	v       float64
	defined bool
}

func (e *estimate) observe(v float64) {
	if !finite(v) {
		return
	}
	if !e.defined {
		e.v, e.defined = v, true
		return
	}
	e.v += smoothing * (v - e.v)
}

// poolState is what the loop remembers of one pool.
type poolState struct {
	// target is the size the planner last asked for, or adopted.
	target int
	known  bool
	// prev and askedAt describe the planner's scale in flight: prev is
	// the size before it, askedAt when it was asked (zero: none).
	prev    int
	askedAt time.Time
	// changed is when the pool's size last changed, by anyone.
	changed time.Time
	// downs are the needs of the last windows, newest last, for
	// scale-down.
	downs []float64
	// manualUntil is when a respected manual change stops freezing it.
	manualUntil time.Time
	need        float64
}

// New is a planner over the worker model m that scales through c.
// Zero fields of cfg take their defaults; a bad cfg is an error wrapping
// ErrBadConfig. A nil log discards.
func New(cfg Config, m perf.Model, c Connector, log *slog.Logger) (*Planner, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("%w: no connector", ErrBadConfig)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	pred, err := newPredictor(cfg.Predictor)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mt, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Planner{cfg: cfg, m: m, conn: c, log: log}
	p.loop = loop{pred: pred, metrics: mt, reg: reg, cp: 1, cd: 1, pools: map[Pool]*poolState{}}
	for _, pool := range cfg.pools() {
		p.pools[pool] = &poolState{}
	}
	p.status = Status{Mode: cfg.Mode, Corrections: Corrections{Prefill: 1, Decode: 1}, Pools: map[Pool]PoolStatus{}}
	return p, nil
}

// Registry holds the planner's metrics.
func (p *Planner) Registry() *prometheus.Registry { return p.reg }

// Step folds one window's observation in and decides, one Decision per
// pool. It reads the pools' sizes from the connector (an error there is
// returned and nothing is decided) and, in active mode, asks it to scale;
// a failed Scale is logged, its Decision is not Applied, and Step returns
// the error after deciding every pool.
func (p *Planner) Step(ctx context.Context, obs Observation) ([]Decision, error) {
	now := obs.End
	if now.IsZero() {
		now = time.Now()
	}
	reps, err := p.conn.Replicas(ctx)
	if err != nil {
		return nil, fmt.Errorf("planner: reading the replicas: %w", err)
	}
	var rate float64
	pred := p.last
	if obs.OK {
		rate = p.observe(obs, reps)
		pred = p.predict(rate)
		pred.Backlog = nonNeg(obs.QueueDepth)
	} else {
		p.metrics.scrapeErrors.Inc()
	}
	need1 := p.m.Need(perf.Load{Rate: 1, ISL: p.isl.v, OSL: p.osl.v, Hit: p.hit.v},
		perf.Targets{TTFT: p.cfg.TTFT, ITL: p.cfg.ITL, TTFTQuantile: p.cfg.TTFTQuantile}, perf.Corrections{Prefill: p.cp, Decode: p.cd})

	var ds []Decision
	for _, pool := range p.cfg.pools() {
		r, seen := reps[pool]
		perRate, infeasible := pool.need(need1)
		ds = append(ds, p.decide(pool, obs.OK, r, seen, perRate, infeasible, rate, pred, now))
	}
	p.budget(ds)
	var errs []error
	for i := range ds {
		if err := p.apply(ctx, &ds[i], now, rate); err != nil {
			errs = append(errs, err)
		}
	}
	p.last = pred
	p.publish(ds, obs, pred, rate)
	return ds, errors.Join(errs...)
}

// observe folds an OK window in and returns its arrival rate.
func (p *Planner) observe(obs Observation, reps map[Pool]Replicas) float64 {
	secs := obs.End.Sub(obs.Start).Seconds()
	if !(secs > 0) {
		secs = p.cfg.Interval.Seconds()
	}
	rate := nonNeg(obs.Arrivals) / secs
	if obs.Arrivals > 0 {
		p.idle = 0
		p.isl.observe(obs.PromptTokens / obs.Arrivals)
	} else {
		p.idle++
	}
	if obs.Finished > 0 && obs.OutputTokens > 0 {
		p.osl.observe(obs.OutputTokens / obs.Finished)
	}
	if obs.PromptTokens > 0 {
		p.hit.observe(min(max(obs.CachedTokens/obs.PromptTokens, 0), 1))
	}
	p.correct(obs, rate, reps)
	return rate
}

// correct updates the corrections from a window with enough requests on
// workers the model does not see saturated: observed latency over what
// the model expects at the observed load, queueing included.
func (p *Planner) correct(obs Observation, rate float64, reps map[Pool]Replicas) {
	prefillers, decoders := reps[Aggregated].Ready, reps[Aggregated].Ready
	if p.cfg.has(Prefill) {
		prefillers, decoders = reps[Prefill].Ready, reps[Decode].Ready
	}
	if prefillers < 1 || decoders < 1 || !p.isl.defined || obs.QueueDepth > backlogPerWorker*float64(prefillers) {
		return
	}
	u := p.isl.v * (1 - p.hit.v)
	s := p.m.PrefillTime(u).Seconds()
	ttft, okT := obs.TTFT.Value()
	if okT && obs.TTFT.Count >= correctionRequests && rate*s/float64(prefillers) < correctionMaxRho {
		if want := p.m.ExpectedTTFT(rate, u, prefillers).Seconds(); want > 0 {
			p.cp = clampCorrection(p.cp + smoothing*(ttft/want-p.cp))
		}
	}
	itl, okI := obs.ITL.Value()
	if okI && obs.Finished >= correctionRequests && p.osl.defined {
		// Little's law: sequences decoding at once, per worker.
		conc := rate * p.osl.v * itl / float64(decoders)
		ctxLen := p.isl.v + p.osl.v/2
		c := max(1, int(math.Round(conc)))
		if float64(c) < correctionMaxRho*float64(p.m.MaxSeqs) && float64(c)*ctxLen < correctionMaxRho*float64(p.m.KVTokens) {
			if want := p.m.DecodeStep(c, ctxLen).Seconds(); want > 0 {
				p.cd = clampCorrection(p.cd + smoothing*(itl/want-p.cd))
			}
		}
	}
}

// prediction is the rate the loop sizes for.
type prediction struct {
	// Rate is the most the predictor expects within the lead time (a
	// new worker's start-up and one window).
	Rate float64
	// Backlog is the requests waiting at the window's end.
	Backlog float64
}

// predict feeds the predictor the window's rate and looks ahead the lead
// time.
func (p *Planner) predict(rate float64) prediction {
	p.pred.Observe(rate)
	h := int(math.Ceil(float64(p.cfg.Interval+p.cfg.StartupDelay) / float64(p.cfg.Interval)))
	var best float64
	for i := 1; i <= max(h, 1); i++ {
		best = max(best, nonNeg(p.pred.Predict(i)))
	}
	return prediction{Rate: best}
}

// need is a pool's workers for one request a second.
func (pool Pool) need(n perf.Need) (float64, string) {
	switch pool {
	case Prefill:
		return n.Prefill, feasible(n.PrefillOK, true)
	case Decode:
		return n.Decode, feasible(true, n.DecodeOK)
	}
	return n.Aggregated, feasible(n.PrefillOK, n.DecodeOK)
}

func feasible(prefill, decode bool) string {
	switch {
	case !prefill:
		return ReasonTTFTInfeasible
	case !decode:
		return ReasonITLInfeasible
	}
	return ""
}

// decide is one pool's decision before the budget: the manual rule, the
// failed-scrape hold, idle, scale-up at once, scale-down with hysteresis
// and cooldown. perRate is the pool's workers for one request a second;
// infeasible is why no count meets the targets, if so.
func (p *Planner) decide(pool Pool, ok bool, r Replicas, seen bool, perRate float64, infeasible string, rate float64, pred prediction, now time.Time) Decision {
	st, lim := p.pools[pool], p.cfg.Pools[pool]
	cur := r.Desired
	if !seen { // the connector does not know the pool: take it as planned
		cur = lim.Min
		if st.known {
			cur = st.target
		}
	}
	d := Decision{At: now, Pool: pool, Current: cur, Target: cur, Mode: p.cfg.Mode, Need: st.need}
	if !st.known {
		st.target, st.known = cur, true
	}
	if cur != st.target {
		switch {
		case p.cfg.Mode == ModeAdvisory: // the deployment is sized by others: follow it
			st.target, st.changed, st.downs = cur, now, nil
		case cur == st.prev && !st.askedAt.IsZero() && now.Sub(st.askedAt) < inFlightFor:
			cur = st.target // the planner's own scale, not carried out yet
		default:
			return p.manual(d, st, now)
		}
	} else {
		st.askedAt = time.Time{}
	}
	if now.Before(st.manualUntil) {
		d.Reason = ReasonManual
		return d
	}
	if !ok {
		d.Reason = ReasonScrapeFailed
		return d
	}

	// Scale-up also drains the requests already waiting within the time a
	// new worker takes to help: a backlog of q is q/(interval + start-up)
	// requests a second more.
	// The backlog waits for prefill: a decode pool does not drain it.
	backlog := pred.Backlog
	if pool == Decode {
		backlog = 0
	}
	drain := (p.cfg.Interval + p.cfg.StartupDelay).Seconds()
	need, needUp := perRate*pred.Rate, perRate*(max(pred.Rate, rate)+backlog/drain)
	reason := ReasonLoad
	if infeasible != "" && max(pred.Rate, rate) > 0 {
		need, needUp, reason = float64(lim.Max), float64(lim.Max), infeasible
	}
	st.need, d.Need = nonNeg(needUp), nonNeg(needUp)
	st.downs = append(st.downs, nonNeg(need))
	if len(st.downs) > p.cfg.DownStable {
		st.downs = st.downs[len(st.downs)-p.cfg.DownStable:]
	}
	cooling := !st.changed.IsZero() && now.Sub(st.changed) < p.cfg.Cooldown

	if p.idle >= p.cfg.IdleWindows {
		d.Need, st.need = 0, 0
		switch {
		case lim.Min >= cur:
			d.Target, d.Reason = lim.Min, ReasonIdle
		case cooling:
			d.Reason = ReasonCooldown
		default:
			d.Target, d.Reason = lim.Min, ReasonIdle
		}
		return d
	}
	if up := clampPool(workers(needUp), lim); up > cur {
		d.Target, d.Reason = up, reason
		return d
	}
	d.Target, d.Reason = cur, ReasonHold
	if len(st.downs) < p.cfg.DownStable {
		return d
	}
	var most float64
	for _, n := range st.downs {
		most = max(most, n)
	}
	if n := clampPool(workers(most*(1+p.cfg.Band)), lim); n < cur {
		if cooling {
			d.Reason = ReasonCooldown
			return d
		}
		step := p.cfg.MaxDownStep
		if step == 0 {
			step = (cur + 1) / 2
		}
		d.Target, d.Reason = max(n, cur-step), reason
	}
	return d
}

// manual handles a size of the pool that the planner did not ask for:
// respected (the pool frozen at it) or overridden, as configured.
func (p *Planner) manual(d Decision, st *poolState, now time.Time) Decision {
	d.Reason = ReasonManual
	if p.cfg.Manual.Override {
		d.Target = st.target
		p.log.Info(fmt.Sprintf("manual change of %s to %d observed; overriding to %d", d.Pool, d.Current, st.target),
			"pool", d.Pool, "observed", d.Current, "target", st.target, "policy", "override")
		return d
	}
	st.manualUntil = now.Add(p.cfg.Manual.Respect)
	p.log.Info(fmt.Sprintf("manual change of %s to %d observed (planner had %d); respected until %s",
		d.Pool, d.Current, st.target, st.manualUntil.Format("15:04:05")),
		"pool", d.Pool, "observed", d.Current, "planner", st.target, "until", st.manualUntil, "policy", "respect")
	st.target, st.changed, st.downs, st.askedAt = d.Current, now, nil, time.Time{}
	return d
}

// budget scales the targets down, in proportion to the pools' needs and
// each to at least its minimum, when together they exceed the budget.
func (p *Planner) budget(ds []Decision) {
	total := 0
	var needs float64
	for _, d := range ds {
		total += d.Target
		needs += d.Need
	}
	if p.cfg.Budget == 0 || total <= p.cfg.Budget {
		return
	}
	share := make([]float64, len(ds))
	give := make([]int, len(ds))
	sum := 0
	for i, d := range ds {
		w := 1 / float64(len(ds))
		if needs > 0 {
			w = d.Need / needs
		}
		share[i] = float64(p.cfg.Budget) * w
		give[i] = min(max(int(share[i]), p.cfg.Pools[d.Pool].Min), d.Target)
		sum += give[i]
	}
	// Over (minimums raised some) or under (floors): move one worker at a
	// time where the share is furthest from what was given.
	for sum != p.cfg.Budget {
		best, gap := -1, 0.0
		for i, d := range ds {
			g := share[i] - float64(give[i])
			if sum > p.cfg.Budget && give[i] > p.cfg.Pools[d.Pool].Min && (best < 0 || g < gap) ||
				sum < p.cfg.Budget && give[i] < d.Target && (best < 0 || g > gap) {
				best, gap = i, g
			}
		}
		if best < 0 {
			break
		}
		if sum > p.cfg.Budget {
			give[best]--
			sum--
		} else {
			give[best]++
			sum++
		}
	}
	for i := range ds {
		if give[i] < ds[i].Target {
			ds[i].Target, ds[i].Reason = give[i], ReasonBudget
		}
	}
}

// apply numbers d and, in active mode, asks the connector for a change.
func (p *Planner) apply(ctx context.Context, d *Decision, now time.Time, rate float64) error {
	p.seq++
	d.Seq = p.seq
	if d.Target == d.Current {
		return nil
	}
	msg := fmt.Sprintf("scale %s %d→%d: need %.2f, rate %.2f/s, %s", d.Pool, d.Current, d.Target, d.Need, rate, d.Reason)
	if p.cfg.Mode == ModeAdvisory {
		p.log.Info("advisory: would "+msg, "pool", d.Pool, "current", d.Current, "target", d.Target, "reason", d.Reason)
		return nil
	}
	st := p.pools[d.Pool]
	if err := p.conn.Scale(ctx, d.Pool, d.Target); err != nil {
		p.log.Warn("failed to "+msg, "pool", d.Pool, "err", err)
		return fmt.Errorf("planner: scaling %s to %d: %w", d.Pool, d.Target, err)
	}
	p.log.Info(msg, "pool", d.Pool, "current", d.Current, "target", d.Target, "reason", d.Reason)
	d.Applied = true
	st.prev, st.target, st.askedAt, st.changed, st.downs = d.Current, d.Target, now, now, nil
	return nil
}

// workers is a need rounded up to whole workers; a need a hair over a
// whole number is that number.
func workers(need float64) int {
	if !finite(need) || need <= 0 {
		return 0
	}
	return int(math.Ceil(min(need, 1e6) - 1e-9))
}

func clampPool(n int, l Limits) int { return min(max(n, l.Min), l.Max) }

// nonNeg is v, or 0 for a negative or non-finite v.
func nonNeg(v float64) float64 {
	if !finite(v) || v < 0 {
		return 0
	}
	return v
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func clampCorrection(v float64) float64 {
	if !finite(v) {
		return 1
	}
	return min(max(v, minCorrection), maxCorrection)
}

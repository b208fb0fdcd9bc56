package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/replay/simulate"
	"github.com/kvstrata/kvstrata/trace"
)

// scalerFlags are the flags of kvctl replay --simulate that size the
// workers while the trace runs.
type scalerFlags struct {
	list          string
	profile       string
	predictor     string
	sloTTFT       time.Duration
	sloITL        time.Duration
	slack         float64
	goal          float64
	hit           float64
	startupDelay  time.Duration
	scaleInterval time.Duration
	minWorkers    int
	maxWorkers    int
}

// scalerOnly are scalerFlags' flags, which mean something only with
// --simulate.
var scalerOnly = []string{"scaler", "planner-profile", "predictor", "slo-ttft", "slo-itl", "slo-ttft-slack", "slo-goal",
	"static-hit", "startup-delay", "scale-interval", "min-workers", "max-workers"}

func (s *scalerFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&s.list, "scaler", "",
		`--simulate: what sizes the workers, comma-separated, one run each: static:N (N workers all along), static-peak and static-mean `+
			`(the workers planner/perf says the busiest --scale-interval window, or the mean load, needs; static-peak is raised by one `+
			`until it meets --slo-goal, --parallel tries at a time, rows static-peak+K), reactive (one worker at a time on queue and KV usage, Dynamo's load-based planner), planner `+
			`(the SLO planner, with --predictor); empty: --workers all along. Dynamic scalers start from --workers`)
	fl.StringVar(&s.profile, "planner-profile", "",
		"--simulate: the worker profile (sim's JSON format) that the simulated workers run and the planner and static sizing model (default: sim's built-in profile)")
	fl.StringVar(&s.predictor, "predictor", planner.DefaultPredictor, "--simulate: the planner's request-rate predictor, a spec as kvstrata planner's --predictor takes")
	fl.DurationVar(&s.sloTTFT, "slo-ttft", simulate.DefaultSLOTTFT, "--simulate: TTFT target; a request is within it when its TTFT ≤ max(this, --slo-ttft-slack × its prefill alone)")
	fl.DurationVar(&s.sloITL, "slo-itl", simulate.DefaultSLOITL, "--simulate: target for a request's mean inter-token latency")
	fl.Float64Var(&s.slack, "slo-ttft-slack", simulate.DefaultSLOTTFTSlack, "--simulate: multiplies a request's TTFT alone (its uncached prompt's prefill on an idle worker) in its TTFT target")
	fl.Float64Var(&s.goal, "slo-goal", 0.99, "--simulate: the share of requests within targets that meets the SLO, in (0, 1]; static-peak is raised until it does")
	fl.Float64Var(&s.hit, "static-hit", -1, "--simulate: prefix-hit fraction static-peak and static-mean size for, in [0, 1]; -1: the trace's own, the share of prompt tokens in leading blocks an earlier request had")
	fl.DurationVar(&s.startupDelay, "startup-delay", simulate.DefaultStartupDelay, "--simulate: time from adding a worker to its first request (0: none)")
	fl.DurationVar(&s.scaleInterval, "scale-interval", simulate.DefaultScaleInterval, "--simulate: time between a scaler's decisions")
	fl.IntVar(&s.minWorkers, "min-workers", simulate.DefaultMinWorkers, "--simulate: fewest workers a scaler may ask for")
	fl.IntVar(&s.maxWorkers, "max-workers", simulate.DefaultMaxWorkers, "--simulate: most workers a scaler may ask for")
}

// apply sets cfg's scaling fields; the scalers themselves need the trace
// (scalers). It returns every problem of the flags.
func (s scalerFlags) apply(cfg *simulate.Config) []string {
	var probs []string
	cfg.SLO = simulate.SLO{TTFT: s.sloTTFT, TTFTSlack: s.slack, ITL: s.sloITL}
	cfg.ScaleInterval, cfg.MinWorkers, cfg.MaxWorkers = s.scaleInterval, s.minWorkers, s.maxWorkers
	cfg.StartupDelay = s.startupDelay
	if s.startupDelay == 0 {
		cfg.StartupDelay = -1 // none, not the default
	}
	if s.profile != "" {
		p, err := sim.ReadProfile(s.profile)
		if err != nil {
			probs = append(probs, fmt.Sprintf("--planner-profile: %v", err))
		} else {
			cfg.Profile = &p
		}
	}
	if s.sloTTFT <= 0 || s.sloITL <= 0 {
		probs = append(probs, fmt.Sprintf("--slo-ttft %v and --slo-itl %v must be positive", s.sloTTFT, s.sloITL))
	}
	if !(s.slack >= 0) {
		probs = append(probs, fmt.Sprintf("--slo-ttft-slack is %v, must be ≥ 0", s.slack))
	}
	if !(s.goal > 0 && s.goal <= 1) {
		probs = append(probs, fmt.Sprintf("--slo-goal is %v, must be in (0, 1]", s.goal))
	}
	if s.hit != -1 && !(s.hit >= 0 && s.hit <= 1) {
		probs = append(probs, fmt.Sprintf("--static-hit is %v, must be in [0, 1] or -1", s.hit))
	}
	if s.startupDelay < 0 {
		probs = append(probs, fmt.Sprintf("--startup-delay is %v, must be ≥ 0", s.startupDelay))
	}
	if s.scaleInterval <= 0 {
		probs = append(probs, fmt.Sprintf("--scale-interval is %v, must be positive", s.scaleInterval))
	}
	if s.minWorkers < 1 || s.maxWorkers < s.minWorkers {
		probs = append(probs, fmt.Sprintf("--min-workers %d and --max-workers %d must satisfy 1 ≤ min ≤ max", s.minWorkers, s.maxWorkers))
	}
	for _, name := range s.names() {
		if _, _, err := parseScaler(name); err != nil {
			probs = append(probs, "--scaler: "+err.Error())
		}
	}
	return probs
}

func (s scalerFlags) names() []string {
	if s.list == "" {
		return nil
	}
	var out []string
	for _, n := range strings.Split(s.list, ",") {
		out = append(out, strings.TrimSpace(n))
	}
	return out
}

// parseScaler splits a --scaler name: its kind, and N for static:N.
func parseScaler(name string) (kind string, n int, err error) {
	if rest, ok := strings.CutPrefix(name, "static:"); ok {
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 {
			return "", 0, fmt.Errorf("%q: static:N wants a worker count ≥ 1", name)
		}
		return "static", n, nil
	}
	switch name {
	case "static-peak", "static-mean", "reactive", "planner":
		return name, 0, nil
	}
	return "", 0, fmt.Errorf("%q is not a scaler (want static:N, static-peak, static-mean, reactive, planner)", name)
}

// sizing is what static-peak and static-mean were sized for.
type sizing struct {
	Hit        float64 `json:"hit"`
	PeakRate   float64 `json:"peak_rate"`
	PeakISL    float64 `json:"peak_isl"`
	PeakOSL    float64 `json:"peak_osl"`
	PeakNeed   float64 `json:"peak_need"`
	MeanRate   float64 `json:"mean_rate"`
	MeanISL    float64 `json:"mean_isl"`
	MeanOSL    float64 `json:"mean_osl"`
	MeanNeed   float64 `json:"mean_need"`
	Peak, Mean int
}

// size computes static-peak's and static-mean's workers with planner/perf:
// ⌈Need.Aggregated⌉ of the busiest window (by need, each window with its
// own rate, ISL and OSL) and of the whole trace's mean load, within the
// worker limits.
func (s scalerFlags) size(reqs []trace.Request, cfg simulate.Config, m perf.Model) sizing {
	hit := s.hit
	if hit < 0 {
		hit = traceHit(reqs)
	}
	tg := perf.Targets{TTFT: s.sloTTFT, ITL: s.sloITL, TTFTQuantile: s.ttftQuantile()}
	win := cfg.ScaleInterval
	type acc struct{ n, isl, osl float64 }
	wins := map[int64]*acc{}
	var total acc
	last := time.Duration(0)
	for _, r := range reqs {
		at := time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / cfg.Speedup)
		last = max(last, at)
		k := int64(at / win)
		if wins[k] == nil {
			wins[k] = &acc{}
		}
		for _, a := range []*acc{wins[k], &total} {
			a.n++
			a.isl += float64(r.InputLength)
			a.osl += float64(r.OutputLength)
		}
	}
	sz := sizing{Hit: hit}
	for _, a := range wins {
		l := perf.Load{Rate: a.n / win.Seconds(), ISL: a.isl / a.n, OSL: a.osl / a.n, Hit: hit}
		if need := m.Need(l, tg, perf.Corrections{}).Aggregated; need > sz.PeakNeed {
			sz.PeakNeed, sz.PeakRate, sz.PeakISL, sz.PeakOSL = need, l.Rate, l.ISL, l.OSL
		}
	}
	span := max(last+win, win).Seconds() // the windows the trace covers
	sz.MeanRate, sz.MeanISL, sz.MeanOSL = total.n/span, total.isl/total.n, total.osl/total.n
	sz.MeanNeed = m.Need(perf.Load{Rate: sz.MeanRate, ISL: sz.MeanISL, OSL: sz.MeanOSL, Hit: hit}, tg, perf.Corrections{}).Aggregated
	clamp := func(x float64) int { return min(max(int(math.Ceil(x)), cfg.MinWorkers), cfg.MaxWorkers) }
	sz.Peak, sz.Mean = clamp(sz.PeakNeed), clamp(sz.MeanNeed)
	return sz
}

// traceHit is the share of prompt tokens in leading blocks that an
// earlier request of reqs also had: what an unbounded cache would serve.
func traceHit(reqs []trace.Request) float64 {
	seen := map[uint64]bool{}
	var hit, all float64
	for _, r := range reqs {
		all += float64(r.InputLength)
		lead := true
		for i, id := range r.HashIDs {
			if lead && seen[id] {
				hit += float64(min(int64(replay.BlockTokens), r.InputLength-int64(i)*replay.BlockTokens))
			} else {
				lead = false
			}
			seen[id] = true
		}
	}
	if all == 0 {
		return 0
	}
	return hit / all
}

// scalers are the NamedScalers of --scaler, static-peak and static-mean
// sized by sz.
func (s scalerFlags) scalers(cfg simulate.Config, sz sizing, m perf.Model) []simulate.NamedScaler {
	log := slog.New(slog.DiscardHandler) // the rows say what the planners did
	var out []simulate.NamedScaler
	for _, name := range s.names() {
		kind, n, _ := parseScaler(name) // checked by apply
		switch kind {
		case "static":
			out = append(out, simulate.NamedScaler{Name: name, Workers: n})
		case "static-peak":
			out = append(out, simulate.NamedScaler{Name: name, Workers: sz.Peak})
		case "static-mean":
			out = append(out, simulate.NamedScaler{Name: name, Workers: sz.Mean})
		case "reactive":
			rcfg := s.reactiveConfig(cfg)
			out = append(out, simulate.NamedScaler{Name: name, New: func() simulate.Scaler {
				r, _ := newReactiveScaler(rcfg, cfg.Workers) // checked by check
				return r
			}})
		case "planner":
			pcfg := s.plannerConfig(cfg)
			out = append(out, simulate.NamedScaler{Name: name, New: func() simulate.Scaler {
				p, _ := newPlannerScaler(pcfg, m, cfg.Workers, log) // checked by check
				return p
			}})
		}
	}
	return out
}

func (s scalerFlags) plannerConfig(cfg simulate.Config) planner.Config {
	// The planner reads a zero start-up delay as its default: none is 1 ns.
	return planner.Config{Mode: planner.ModeActive, Interval: cfg.ScaleInterval, StartupDelay: max(cfg.StartupDelay, time.Nanosecond),
		TTFT: s.sloTTFT, ITL: s.sloITL, TTFTQuantile: s.ttftQuantile(), Predictor: s.predictor,
		Pools: map[planner.Pool]planner.Limits{planner.Aggregated: {Min: cfg.MinWorkers, Max: cfg.MaxWorkers}}}
}

// ttftQuantile is the TTFT quantile static sizing and the planner size
// for: the SLO's goal, so that both provision for the share of requests
// the SLO counts rather than for the mean.
func (s scalerFlags) ttftQuantile() float64 { return min(s.goal, 0.999) }

func (s scalerFlags) reactiveConfig(cfg simulate.Config) planner.ReactiveConfig {
	return planner.ReactiveConfig{Limits: planner.Limits{Min: cfg.MinWorkers, Max: cfg.MaxWorkers}}
}

// check makes each dynamic scaler once, so that a bad --predictor or
// limit is a usage error before anything runs.
func (s scalerFlags) check(cfg simulate.Config, m perf.Model) []string {
	var probs []string
	for _, name := range s.names() {
		var err error
		switch name {
		case "reactive":
			_, err = newReactiveScaler(s.reactiveConfig(cfg), cfg.Workers)
		case "planner":
			_, err = newPlannerScaler(s.plannerConfig(cfg), m, cfg.Workers, nil)
		}
		if err != nil {
			probs = append(probs, fmt.Sprintf("--scaler %s: %v", name, err))
		}
	}
	return probs
}

// perfModel is planner/perf's model of the simulated workers.
func perfModel(cfg simulate.Config) (perf.Model, error) {
	p := sim.DefaultProfile()
	if cfg.Profile != nil {
		p = *cfg.Profile
	}
	return perf.New(p, sim.WorkerLimits{KVTokens: cfg.PoolTokens, BlockTokens: cfg.BlockTokens,
		MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens})
}

// raisePeak reruns static-peak larger while its row misses the goal, and
// returns the tries' rows too: one worker more each try, Config.Parallel
// tries at once (the smallest that meets the goal ends the search).
func (s scalerFlags) raisePeak(ctx context.Context, reqs []trace.Request, cfg simulate.Config, rows []simulate.Row, progress io.Writer) ([]simulate.Row, error) {
	for i := range rows {
		if rows[i].Scaler != "static-peak" {
			continue
		}
		row := rows[i]
		for row.SLOAttainment < s.goal && row.WorkersMax < cfg.MaxWorkers {
			c := cfg
			c.Scalers = nil
			for n := row.WorkersMax + 1; n <= min(row.WorkersMax+cfg.Parallel, cfg.MaxWorkers); n++ {
				c.Scalers = append(c.Scalers, simulate.NamedScaler{Name: fmt.Sprintf("static-peak+%d", n-rows[i].WorkersMax), Workers: n})
			}
			fmt.Fprintf(progress, "static-peak with %d workers: %.2f%% within targets, under %.2f%%; trying %d more\n",
				row.WorkersMax, 100*row.SLOAttainment, 100*s.goal, len(c.Scalers))
			more, err := simulate.Run(ctx, reqs, c)
			if err != nil {
				return rows, err
			}
			for _, r := range more {
				rows = append(rows, r)
				row = r
				if r.SLOAttainment >= s.goal {
					break
				}
			}
		}
	}
	return rows, nil
}

// writeScalerTable writes the rows of runs with scalers for people.
func writeScalerTable(a *app, name string, n int, cfg simulate.Config, rows []simulate.Row, wall time.Duration) {
	w := a.stdout
	fmt.Fprintf(w, "%s: %d requests at speedup %g, workers sized every %v (start-up %v, %d to %d workers; dynamic scalers start with %d), "+
		"SLO TTFT ≤ max(%v, %g × alone) and mean ITL ≤ %v, in virtual time; %s of wall time\n\n",
		name, n, cfg.Speedup, cfg.ScaleInterval, max(cfg.StartupDelay, 0), cfg.MinWorkers, cfg.MaxWorkers, cfg.Workers,
		cfg.SLO.TTFT, cfg.SLO.TTFTSlack, cfg.SLO.ITL, wall.Round(time.Millisecond))
	sec := func(v float64) string { return formatLatency(time.Duration(v * float64(time.Second))) }
	var table [][]string
	for _, r := range rows {
		table = append(table, []string{r.Scaler, r.Router, r.Cache, fmt.Sprintf("%.2f%%", 100*r.SLOAttainment),
			fmt.Sprintf("%.0f", r.WorkerSeconds), fmt.Sprintf("%.2f", r.WorkersMean), fmt.Sprint(r.WorkersMax),
			fmt.Sprintf("%d/%d", r.ScaleUps, r.ScaleDowns), sec(r.TTFTMeanS), sec(r.TTFTP99S), sec(r.ITLMeanS), fmt.Sprint(r.Failed)})
	}
	_ = writeTable(w, []string{"SCALER", "ROUTER", "CACHE", "WITHIN SLO", "WORKER-S", "MEAN W", "MAX W", "UPS/DOWNS",
		"TTFT MEAN", "TTFT P99", "ITL MEAN", "FAILED"}, table)
	fmt.Fprintf(w, "\nworker-s: every worker's time from its add (start-up included) to its retirement; ups/downs: the scaler's decisions that added and removed workers\n")
}

// writeSizing says what static-peak and static-mean were sized for.
func writeSizing(w io.Writer, sz sizing, s scalerFlags) {
	src := "the trace's own"
	if s.hit >= 0 {
		src = "--static-hit"
	}
	fmt.Fprintf(w, "static sizing (planner/perf, TTFT %v, ITL %v, prefix hits %.1f%%, %s): peak window %.2f req/s, ISL %.0f, OSL %.0f → need %.2f → %d workers; "+
		"mean %.2f req/s, ISL %.0f, OSL %.0f → need %.2f → %d workers\n",
		s.sloTTFT, s.sloITL, 100*sz.Hit, src, sz.PeakRate, sz.PeakISL, sz.PeakOSL, sz.PeakNeed, sz.Peak,
		sz.MeanRate, sz.MeanISL, sz.MeanOSL, sz.MeanNeed, sz.Mean)
}

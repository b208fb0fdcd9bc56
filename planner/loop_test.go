package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// The loop's tests drive a planner with scripted windows against a fake
// deployment: the connector is the planner's peer, an interface it owns,
// and a fake is the deployment a test can script manual changes on.

// fakeDeployment is a Connector whose scales take effect at once.
type fakeDeployment struct {
	mu      sync.Mutex
	reps    map[Pool]Replicas
	scales  []scaled
	noScale bool // Scale fails the test (advisory)
	t       *testing.T
}

type scaled struct {
	pool Pool
	n    int
}

func newDeployment(t *testing.T, sizes map[Pool]int) *fakeDeployment {
	d := &fakeDeployment{reps: map[Pool]Replicas{}, t: t}
	for p, n := range sizes {
		d.reps[p] = Replicas{Desired: n, Ready: n}
	}
	return d
}

func (d *fakeDeployment) Replicas(context.Context) (map[Pool]Replicas, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[Pool]Replicas{}
	for p, r := range d.reps {
		out[p] = r
	}
	return out, nil
}

func (d *fakeDeployment) Scale(_ context.Context, p Pool, n int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.noScale {
		d.t.Errorf("Scale(%s, %d) called", p, n)
	}
	d.scales = append(d.scales, scaled{p, n})
	d.reps[p] = Replicas{Desired: n, Ready: n}
	return nil
}

// set is a manual change: someone else sizes pool p.
func (d *fakeDeployment) set(p Pool, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reps[p] = Replicas{Desired: n, Ready: n}
}

func (d *fakeDeployment) size(p Pool) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reps[p].Desired
}

func (d *fakeDeployment) scaleCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.scales)
}

// The scripted traffic: every request has isl prompt and osl output
// tokens, windows are 30 s long.
const (
	isl, osl = 2048.0, 256.0
	window   = 30 * time.Second
)

var t0 = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)

func testModel(t *testing.T) perf.Model {
	m, err := perf.New(sim.DefaultProfile(), sim.WorkerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testConfig() Config {
	return Config{Interval: window, StartupDelay: window, TTFT: 2 * time.Second, ITL: 50 * time.Millisecond,
		Pools: map[Pool]Limits{Aggregated: {Min: 1, Max: 8}}, Predictor: "constant"}
}

// harness steps a planner through windows numbered from 0.
type harness struct {
	t    *testing.T
	p    *Planner
	dep  *fakeDeployment
	log  *bytes.Buffer
	m    perf.Model
	next int // the next window's number
}

func newHarness(t *testing.T, cfg Config, dep *fakeDeployment) *harness {
	t.Helper()
	log := &bytes.Buffer{}
	m := testModel(t)
	p, err := New(cfg, m, dep, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, p: p, dep: dep, log: log, m: m}
}

// rateFor is the arrival rate at which an aggregated pool needs need
// workers, with the test's lengths and no cache hits.
func (h *harness) rateFor(need float64) float64 {
	n := h.m.Need(perf.Load{Rate: 1, ISL: isl, OSL: osl}, perf.Targets{TTFT: h.p.cfg.TTFT, ITL: h.p.cfg.ITL}, perf.Corrections{})
	return need / n.Aggregated
}

// step feeds one OK window with the arrivals that need need workers.
func (h *harness) step(need float64) []Decision {
	h.t.Helper()
	a := h.rateFor(need) * window.Seconds()
	return h.stepObs(Observation{OK: true, Arrivals: a, Finished: a, PromptTokens: a * isl, OutputTokens: a * osl})
}

func (h *harness) stepObs(obs Observation) []Decision {
	h.t.Helper()
	obs.Start = t0.Add(time.Duration(h.next) * window)
	obs.End = obs.Start.Add(window)
	h.next++
	ds, err := h.p.Step(context.Background(), obs)
	if err != nil {
		h.t.Fatalf("window %d: %v", h.next-1, err)
	}
	h.checkFinite()
	return ds
}

// checkFinite: no metric and no status field is NaN or infinite, and the
// status encodes as JSON (which refuses NaN).
func (h *harness) checkFinite() {
	h.t.Helper()
	mfs, err := h.p.Registry().Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, v := range []float64{m.GetGauge().GetValue(), m.GetCounter().GetValue()} {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					h.t.Fatalf("window %d: %s%v is %v", h.next-1, mf.GetName(), m.GetLabel(), v)
				}
			}
		}
	}
	s := h.p.Status()
	if _, err := json.Marshal(s); err != nil {
		h.t.Fatalf("window %d: the status does not encode: %v\n%+v", h.next-1, err, s)
	}
}

func (h *harness) gauge(name, label string) float64 {
	h.t.Helper()
	mfs, _ := h.p.Registry().Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
			if label == "" {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
	}
	h.t.Fatalf("no %s{%s}", name, label)
	return 0
}

func only(t *testing.T, ds []Decision) Decision {
	t.Helper()
	if len(ds) != 1 {
		t.Fatalf("%d decisions, want 1: %+v", len(ds), ds)
	}
	return ds[0]
}

// TestTrafficThatStopsGoesToMinimum: under load the pool grows at once;
// when arrivals stop, after IdleWindows empty windows and the cooldown it
// goes to its minimum, whatever the predictor remembers, and nothing the
// planner publishes is ever NaN (Dynamo's planner stalled on NaN averages
// of an idle window).
func TestTrafficThatStopsGoesToMinimum(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	cfg := testConfig()
	cfg.Predictor = "ewma:0.3" // remembers the load for a long time
	h := newHarness(t, cfg, dep)
	d := only(t, h.step(5.5))
	if d.Target != 6 || !d.Applied || d.Reason != ReasonLoad || dep.size(Aggregated) != 6 {
		t.Fatalf("under a need of 5.5: %+v, deployment at %d; want 1→6 at once", d, dep.size(Aggregated))
	}
	for range 3 {
		h.step(5.5)
	}
	// Traffic stops. The cooldown (5 min = 10 windows) runs from the
	// scale-up in window 0.
	var reached int
	for i := 0; i < 20 && reached == 0; i++ {
		d = only(t, h.stepObs(Observation{OK: true}))
		if dep.size(Aggregated) == 1 {
			reached = h.next - 1
		}
	}
	if reached == 0 {
		t.Fatalf("still %d workers 20 windows after traffic stopped; last decision %+v", dep.size(Aggregated), d)
	}
	if d.Reason != ReasonIdle || d.Need != 0 {
		t.Errorf("the decision to go to the minimum: %+v, want reason idle, need 0", d)
	}
	if at := t0.Add(time.Duration(reached+1) * window); at.Sub(t0.Add(window)) < DefaultCooldown {
		t.Errorf("went to the minimum at window %d, inside the cooldown", reached)
	}
	s := h.p.Status()
	if s.IdleWindows < cfg.IdleWindows || s.ObservedRate != 0 || s.Pools[Aggregated].Target != 1 || s.Predicted.ISL != isl {
		t.Errorf("status after traffic stopped: %+v; want idle, rate 0, target 1, the last ISL kept", s)
	}
	// Still at the minimum, still finite, while nothing arrives.
	for range 5 {
		if d := only(t, h.stepObs(Observation{OK: true})); d.Target != 1 {
			t.Fatalf("idle: %+v", d)
		}
	}
	if g := h.gauge("kvstrata_planner_desired_replicas", "aggregated"); g != 1 {
		t.Errorf("kvstrata_planner_desired_replicas = %v, want 1", g)
	}
}

// TestNeedOscillatingAroundOneChangesOnce: a need swinging between 0.9
// and 1.1 grows the pool to 2 once and then changes nothing (Dynamo's
// planner flapped between 2 and 1).
func TestNeedOscillatingAroundOneChangesOnce(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	h := newHarness(t, testConfig(), dep)
	for i := range 60 {
		h.step(1 + 0.1*math.Sin(float64(i)*math.Pi/4+math.Pi/2))
	}
	if len(dep.scales) != 1 || dep.scales[0] != (scaled{Aggregated, 2}) {
		t.Errorf("scales: %v, want one, to 2", dep.scales)
	}
}

// TestCooldownAndStepBoundScaleDown: after a scale-up the pool shrinks
// only when the cooldown has passed and the lower need held for
// DownStable windows, by at most MaxDownStep at a time.
func TestCooldownAndStepBoundScaleDown(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	h := newHarness(t, testConfig(), dep)
	h.step(7.5) // window 0: 1→8
	var downs []int
	var cooldown bool
	for range 40 {
		d := only(t, h.step(0.5))
		cooldown = cooldown || d.Reason == ReasonCooldown
		if d.Target < d.Current {
			downs = append(downs, h.next-1)
			if d.Current-d.Target > (d.Current+1)/2 {
				t.Errorf("window %d: %d→%d, more than half the pool", h.next-1, d.Current, d.Target)
			}
		}
	}
	if !cooldown || len(downs) != 3 {
		t.Fatalf("scale-downs in windows %v (a cooldown reason seen: %v); want 8→4→2→1, each a cooldown apart", downs, cooldown)
	}
	for i, w := range downs {
		prev := 0 // the scale-up
		if i > 0 {
			prev = downs[i-1]
		}
		if time.Duration(w-prev)*window < DefaultCooldown {
			t.Errorf("a scale-down in window %d, %d windows after the change before it: inside the cooldown", w, w-prev)
		}
	}
	if got := dep.size(Aggregated); got != 1 {
		t.Errorf("after 40 quiet windows: %d workers, want 1 (ceil(0.5 × 1.15)); scale-downs in windows %v", got, downs)
	}
}

// TestManualChangeRespected: a size the planner did not ask for freezes
// the pool at it for Manual.Respect, and the log says until when.
func TestManualChangeRespected(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 2})
	cfg := testConfig()
	cfg.Manual = ManualPolicy{Respect: 10 * time.Minute}
	h := newHarness(t, cfg, dep)
	h.step(1.5)
	dep.set(Aggregated, 5)
	d := only(t, h.step(0.5))
	if d.Reason != ReasonManual || d.Target != 5 || d.Applied {
		t.Fatalf("the step that sees the manual change: %+v; want reason manual, target 5, not applied", d)
	}
	if !strings.Contains(h.log.String(), "manual change of aggregated to 5 observed (planner had 2); respected until 03:11:00") {
		t.Errorf("the log does not say the change is respected until when:\n%s", h.log)
	}
	frozen := 0
	for dep.size(Aggregated) == 5 && h.next < 60 {
		d = only(t, h.step(0.5))
		if d.Reason == ReasonManual {
			frozen++
		}
	}
	if frozen < 19 || dep.size(Aggregated) == 5 {
		t.Errorf("frozen for %d windows, then %d workers; want 19 windows (10 min) then smaller", frozen, dep.size(Aggregated))
	}
}

// TestManualChangeOverridden: with Manual.Override the planner scales the
// pool back at once, and the log says so.
func TestManualChangeOverridden(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	cfg := testConfig()
	cfg.Manual = ManualPolicy{Override: true}
	h := newHarness(t, cfg, dep)
	h.step(1.5) // 1→2
	dep.set(Aggregated, 5)
	d := only(t, h.step(1.5))
	if d.Reason != ReasonManual || d.Target != 2 || !d.Applied || dep.size(Aggregated) != 2 {
		t.Fatalf("%+v, deployment at %d; want the manual 5 overridden back to 2", d, dep.size(Aggregated))
	}
	if !strings.Contains(h.log.String(), "manual change of aggregated to 5 observed; overriding to 2") {
		t.Errorf("the log does not say the change is overridden:\n%s", h.log)
	}
	if d := only(t, h.step(1.5)); d.Reason == ReasonManual {
		t.Errorf("the planner's own scale back read as a manual change: %+v", d)
	}
}

// TestAdvisoryPublishesButNeverScales: in advisory mode the planner reads
// the sizes and decides, logs and publishes what it would do, and never
// calls Scale.
func TestAdvisoryPublishesButNeverScales(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 2})
	dep.noScale = true
	cfg := testConfig()
	cfg.Mode = ModeAdvisory
	h := newHarness(t, cfg, dep)
	d := only(t, h.step(4.2))
	if d.Target != 5 || d.Current != 2 || d.Applied || d.Mode != ModeAdvisory {
		t.Errorf("%+v; want an advice 2→5, not applied", d)
	}
	if !strings.Contains(h.log.String(), "advisory: would scale aggregated 2→5: need 4.20") {
		t.Errorf("the log does not give the advice:\n%s", h.log)
	}
	if g := h.gauge("kvstrata_planner_desired_replicas", "aggregated"); g != 5 {
		t.Errorf("desired replicas %v, want 5", g)
	}
	if g := h.gauge("kvstrata_planner_current_replicas", "aggregated"); g != 2 {
		t.Errorf("current replicas %v, want 2", g)
	}
	if g := h.gauge("kvstrata_planner_decisions_total", "up"); g != 1 {
		t.Errorf("decisions_total{direction=up} = %v, want 1", g)
	}
	// Someone else sizes the deployment: advice follows, no manual hold.
	dep.set(Aggregated, 5)
	if d := only(t, h.step(4.2)); d.Reason == ReasonManual || d.Target != 5 {
		t.Errorf("after the deployment took the advice: %+v", d)
	}
}

// TestBudgetSplitsInProportion: when prefill and decode together need
// more than the budget, both shrink in proportion to their needs, each to
// at least its minimum.
func TestBudgetSplitsInProportion(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Prefill: 1, Decode: 1})
	cfg := testConfig()
	cfg.Pools = map[Pool]Limits{Prefill: {Min: 1, Max: 20}, Decode: {Min: 1, Max: 20}}
	cfg.Budget = 6
	h := newHarness(t, cfg, dep)
	a := 40 * window.Seconds() // 40 requests a second
	ds := h.stepObs(Observation{OK: true, Arrivals: a, Finished: a, PromptTokens: a * isl, OutputTokens: a * osl})
	total := 0
	for _, d := range ds {
		total += d.Target
		if d.Target < 1 || d.Reason != ReasonBudget {
			t.Errorf("%+v; want at least the minimum, reason budget", d)
		}
	}
	p, dc := ds[1], ds[0] // pools in name order: decode, prefill
	// Needs 2.19 and 5.80 of 6: shares 1.64 and 4.36, floors 1 and 4, the
	// worker left to the larger remainder.
	if total != 6 || p.Target != 2 || dc.Target != 4 {
		t.Errorf("prefill needs %.2f → %d, decode %.2f → %d; want 2 and 4, in proportion within the budget 6",
			p.Need, p.Target, dc.Need, dc.Target)
	}
	if dep.size(Prefill)+dep.size(Decode) != 6 {
		t.Errorf("the deployment has %d + %d workers", dep.size(Prefill), dep.size(Decode))
	}
}

// TestFailedScrapeHolds: windows that could not be observed are not idle
// ones: the pool keeps its size however many there are, and they are
// counted.
func TestFailedScrapeHolds(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	h := newHarness(t, testConfig(), dep)
	h.step(5.5)
	for range 30 {
		if d := only(t, h.stepObs(Observation{})); d.Target != 6 || d.Reason != ReasonScrapeFailed {
			t.Fatalf("a failed scrape: %+v; want a hold at 6", d)
		}
	}
	if dep.size(Aggregated) != 6 || dep.scaleCount() != 1 {
		t.Errorf("%d workers after %v scales, want 6 after 1", dep.size(Aggregated), dep.scales)
	}
	if g := h.gauge("kvstrata_planner_scrape_errors_total", ""); g != 30 {
		t.Errorf("scrape errors %v, want 30", g)
	}
	if s := h.p.Status(); s.ScrapeErrors != 30 || s.Predicted.Rate == 0 {
		t.Errorf("status %+v: want 30 scrape errors and the last prediction kept", s)
	}
}

// TestCorrectionsNeedEnoughRequests: the prefill correction moves by the
// EWMA toward observed over expected TTFT only in windows with at least
// 20 requests, and stays within [0.5, 4].
func TestCorrectionsNeedEnoughRequests(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 4})
	h := newHarness(t, testConfig(), dep)
	obs := func(n, ttftFactor float64) Observation {
		rate := n / window.Seconds()
		want := h.m.ExpectedTTFT(rate, isl, 4).Seconds()
		return Observation{OK: true, Arrivals: n, Finished: n, PromptTokens: n * isl, OutputTokens: n * osl,
			TTFT: Mean{Sum: n * want * ttftFactor, Count: n}}
	}
	h.stepObs(obs(10, 3))
	if c := h.p.Status().Corrections.Prefill; c != 1 {
		t.Errorf("after 10 requests 3× slower: correction %v, want 1 (too few)", c)
	}
	h.stepObs(obs(30, 2))
	if c := h.p.Status().Corrections.Prefill; math.Abs(c-1.3) > 1e-6 {
		t.Errorf("after 30 requests 2× slower: correction %v, want 1 + 0.3 × (2 − 1) = 1.3", c)
	}
	for range 30 {
		h.stepObs(obs(30, 100))
	}
	if c := h.p.Status().Corrections.Prefill; c != 4 {
		t.Errorf("after many 100× slower windows: correction %v, want the clamp 4", c)
	}
}

// TestBadConfigSaysEveryProblem: New refuses a bad config with one error
// naming each problem.
func TestBadConfigSaysEveryProblem(t *testing.T) {
	cfg := Config{Mode: "eager", Pools: map[Pool]Limits{Aggregated: {Min: 3, Max: 2}, Decode: {Max: 1}}, Budget: 1, Band: -1, Predictor: "oracle"}
	_, err := New(cfg, testModel(t), newDeployment(t, nil), nil)
	if !errors.Is(err, ErrBadConfig) {
		t.Fatalf("New: %v, want ErrBadConfig", err)
	}
	for _, want := range []string{`mode "eager"`, "TTFT target is 0s", "aggregated alone", "limits 3-2", "budget 1", "band -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
	cfg = testConfig()
	cfg.Predictor = "oracle"
	if _, err := New(cfg, testModel(t), newDeployment(t, nil), nil); !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), `"oracle"`) {
		t.Errorf("an unknown predictor: %v", err)
	}
}

// TestInfeasibleTargetAsksForTheMost: when a prompt alone takes longer
// than the TTFT target, no count meets it: the pool goes to its maximum,
// and the reason says why.
func TestInfeasibleTargetAsksForTheMost(t *testing.T) {
	dep := newDeployment(t, map[Pool]int{Aggregated: 1})
	cfg := testConfig()
	cfg.TTFT = 10 * time.Millisecond // a 2048-token prefill takes about 49 ms
	h := newHarness(t, cfg, dep)
	if d := only(t, h.stepObs(Observation{OK: true, Arrivals: 3, Finished: 3, PromptTokens: 3 * isl, OutputTokens: 3 * osl})); d.Target != 8 || d.Reason != ReasonTTFTInfeasible {
		t.Errorf("%+v; want the maximum 8, reason ttft-infeasible", d)
	}
}

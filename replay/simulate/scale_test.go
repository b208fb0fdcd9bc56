package simulate

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/router/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// script is a Scaler that wants 2 workers, then 4 from 60 s, then 2 again
// from 180 s, whatever the load.
type script struct{ windows []Window }

func (s *script) Tick(now time.Duration, w Window) int {
	s.windows = append(s.windows, w)
	switch {
	case now >= 180*time.Second:
		return 2
	case now >= 60*time.Second:
		return 4
	}
	return 2
}

// steady is a request every half second for 5 minutes, each with a prefix
// of its own and 300 tokens of output, so that workers hold requests when
// they are drained.
func steady() []trace.Request {
	var reqs []trace.Request
	for i := range 600 {
		reqs = append(reqs, req(int64(i)*500, 4*replay.BlockTokens, 300, ids(uint64(10*i), 4)...))
	}
	return reqs
}

type stateChange struct {
	at   time.Duration
	name string
	st   workerState
}

func TestAScalerScalesTwoToFourToTwoWithAStartupDelay(t *testing.T) {
	var sc *script
	cfg := small(policy.LeastLoaded)
	cfg.Scalers = []NamedScaler{{Name: "script", New: func() Scaler { sc = &script{}; return sc }}}
	cfg.StartupDelay = 60 * time.Second
	var changes []stateChange
	var bad []string
	servedBy := map[string]bool{}
	cfg.onWorker = func(at time.Duration, name string, st workerState) {
		changes = append(changes, stateChange{at, name, st})
	}
	cfg.onCandidates = func(ws []*worker) {
		for _, w := range ws {
			if w.state != serving {
				bad = append(bad, fmt.Sprintf("%s (%s)", w.name, w.state))
			}
			servedBy[w.name] = true
		}
	}
	reqs := steady()
	row := runRows(t, reqs, cfg)["least-loaded"]
	if len(bad) > 0 {
		t.Fatalf("candidates included workers that do not serve: %v", bad)
	}

	// The life of each worker, from the changes seen.
	added := map[string]time.Duration{}
	ready := map[string]time.Duration{}
	drained := map[string]time.Duration{}
	gone := map[string]time.Duration{}
	for _, c := range changes {
		switch c.st {
		case starting:
			added[c.name] = c.at
		case serving:
			if _, ok := added[c.name]; !ok {
				added[c.name] = c.at
			}
			ready[c.name] = c.at
		case draining:
			drained[c.name] = c.at
		case retired:
			gone[c.name] = c.at
		}
	}
	for _, name := range []string{"worker-2", "worker-3"} {
		if added[name] != 60*time.Second || ready[name] != 120*time.Second {
			t.Errorf("%s added at %v and ready at %v, want 1m0s and 2m0s (a start-up delay of 60 s)", name, added[name], ready[name])
		}
		if !servedBy[name] {
			t.Errorf("%s was never a candidate", name)
		}
	}
	if len(added) != 4 || len(drained) != 2 {
		t.Fatalf("%d workers added and %d drained, want 4 and 2: %v", len(added), len(drained), changes)
	}
	waited := false
	for name, at := range drained {
		if at != 180*time.Second {
			t.Errorf("%s drained at %v, want 3m0s", name, at)
		}
		end, ok := gone[name]
		if !ok {
			t.Fatalf("%s was drained and never retired", name)
		}
		waited = waited || end > at
	}
	if !waited {
		t.Errorf("no drained worker had a request left to finish: the test does not show drains finishing")
	}

	// Worker-seconds: each worker from its add to its retirement or the end.
	end := time.Duration(row.DurationS * float64(time.Second))
	var want time.Duration
	for name, at := range added {
		stop, ok := gone[name]
		if !ok {
			stop = end
		}
		want += stop - at
	}
	if math.Abs(row.WorkerSeconds-want.Seconds()) > 1e-6 {
		t.Errorf("worker-seconds %v, want %v from the workers' lives", row.WorkerSeconds, want.Seconds())
	}
	if row.WorkersMax != 4 || row.ScaleUps != 1 || row.ScaleDowns != 1 || row.Scaler != "script" {
		t.Errorf("row: scaler %q, workers max %d, scale ups %d, downs %d; want script, 4, 1, 1", row.Scaler, row.WorkersMax, row.ScaleUps, row.ScaleDowns)
	}
	if math.Abs(row.WorkersMean-row.WorkerSeconds/row.DurationS) > 1e-9 {
		t.Errorf("workers mean %v, want worker-seconds over the duration %v", row.WorkersMean, row.WorkerSeconds/row.DurationS)
	}

	// The windows: every arrival is counted once, and the states add up.
	arrivals := 0
	for i, w := range sc.windows {
		arrivals += w.Arrivals
		if w.End != time.Duration(i+1)*30*time.Second {
			t.Errorf("window %d ends at %v, want every 30 s", i, w.End)
		}
	}
	w := sc.windows[2] // the tick at 90 s: two serving, two starting
	if w.Serving != 2 || w.Starting != 2 || w.Draining != 0 {
		t.Errorf("at 90 s: %d serving, %d starting, %d draining; want 2, 2, 0", w.Serving, w.Starting, w.Draining)
	}
	if last := sc.windows[len(sc.windows)-1]; arrivals != len(reqs) && last.End < 300*time.Second {
		t.Errorf("the windows counted %d arrivals of %d", arrivals, len(reqs))
	}

	// The same config gives the same row.
	again := runRows(t, reqs, cfg)["least-loaded"]
	row.WallS, again.WallS = 0, 0
	a, _ := json.Marshal(row)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Fatalf("two runs differ:\n%s\n%s", a, b)
	}
}

func TestScalingDownCancelsAStartingWorkerFirst(t *testing.T) {
	// 2 → 4 at 30 s, then 3 at 60 s, before the new ones are ready at 90 s.
	cfg := small(policy.RoundRobin)
	cfg.StartupDelay = 60 * time.Second
	cfg.Scalers = []NamedScaler{{Name: "down", New: func() Scaler {
		return scalerFunc(func(now time.Duration, _ Window) int {
			switch {
			case now >= 60*time.Second:
				return 3
			case now >= 30*time.Second:
				return 4
			}
			return 2
		})
	}}}
	var changes []stateChange
	cfg.onWorker = func(at time.Duration, name string, st workerState) {
		changes = append(changes, stateChange{at, name, st})
	}
	row := runRows(t, steady()[:200], cfg)["round-robin"]
	var drains, cancels []string
	for _, c := range changes {
		if c.st == draining {
			drains = append(drains, c.name)
		}
		if c.st == retired && c.at == 60*time.Second {
			cancels = append(cancels, c.name)
		}
	}
	if len(drains) != 0 || len(cancels) != 1 || cancels[0] != "worker-3" {
		t.Fatalf("scaling 4 → 3 drained %v and cancelled %v, want the newest starting worker (worker-3) cancelled: %v", drains, cancels, changes)
	}
	if row.WorkersMax != 4 {
		t.Errorf("workers max %d, want 4", row.WorkersMax)
	}
}

type scalerFunc func(now time.Duration, w Window) int

func (f scalerFunc) Tick(now time.Duration, w Window) int { return f(now, w) }

func TestSLOAttainmentCountsRequestsWithinTargets(t *testing.T) {
	var reqs []trace.Request // one short request every 3 s
	for i := range 20 {
		reqs = append(reqs, req(int64(i)*3000, 4*replay.BlockTokens, 30, ids(uint64(10*i), 4)...))
	}
	cfg := small(policy.RoundRobin)
	row := runRows(t, reqs, cfg)["round-robin"]
	if row.SLOAttainment != 1 {
		t.Errorf("attainment %v at a light load, want 1", row.SLOAttainment)
	}
	cfg.SLO.ITL = time.Microsecond // no decode step is that fast
	row = runRows(t, reqs, cfg)["round-robin"]
	if row.SLOAttainment != 0 {
		t.Errorf("attainment %v with an ITL target of 1 µs, want 0", row.SLOAttainment)
	}
	if row.Scaler != "static:2" || row.WorkersMax != 2 || math.Abs(row.WorkerSeconds-2*row.DurationS) > 1e-6 {
		t.Errorf("fixed workers: scaler %q, max %d, worker-seconds %v over %v s; want static:2, 2, twice the duration",
			row.Scaler, row.WorkersMax, row.WorkerSeconds, row.DurationS)
	}
}

func TestANegativeStartupDelayIsNoneEvenIfDefaultsRunTwice(t *testing.T) {
	cfg := small(policy.RoundRobin)
	cfg.StartupDelay = -1
	cfg.EnsureDefaults() // as kvctl does before Run does again
	cfg.Scalers = []NamedScaler{{Name: "up", New: func() Scaler { return scalerFunc(func(time.Duration, Window) int { return 3 }) }}}
	var ready []time.Duration
	cfg.onWorker = func(at time.Duration, name string, st workerState) {
		if name == "worker-2" {
			ready = append(ready, at)
		}
	}
	runRows(t, steady()[:100], cfg)
	if len(ready) != 2 || ready[0] != 30*time.Second || ready[1] != 30*time.Second {
		t.Fatalf("worker-2 added and ready at %v, want both at the first tick (30 s): no start-up delay", ready)
	}
}

package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/replay/simulate"
)

// simConnector is a planner.Connector over a simulated deployment: Desired
// is what was last asked for, Ready the workers serving at the tick.
type simConnector struct{ desired, ready int }

func (c *simConnector) Replicas(context.Context) (map[planner.Pool]planner.Replicas, error) {
	return map[planner.Pool]planner.Replicas{planner.Aggregated: {Desired: c.desired, Ready: c.ready}}, nil
}

func (c *simConnector) Scale(_ context.Context, _ planner.Pool, n int) error {
	c.desired = n
	return nil
}

// simEpoch is the wall time a simulated run's virtual time 0 stands for.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// observation is a window as the planner reads the frontend's metrics.
func observation(w simulate.Window) planner.Observation {
	return planner.Observation{
		Start: simEpoch.Add(w.Start), End: simEpoch.Add(w.End), OK: true,
		Arrivals: float64(w.Arrivals), Finished: float64(w.Finished),
		PromptTokens: float64(w.PromptTokens), CachedTokens: float64(w.CachedTokens), OutputTokens: float64(w.OutputTokens),
		TTFT:       planner.Mean{Sum: w.TTFTSum.Seconds(), Count: float64(w.TTFTCount)},
		ITL:        planner.Mean{Sum: w.ITLSum.Seconds(), Count: float64(w.ITLCount)},
		QueueDepth: float64(w.QueueDepth),
	}
}

// plannerScaler is the SLO planner in the simulated loop: each tick's
// window becomes an Observation, Step decides, and the target is what it
// asked its connector for.
type plannerScaler struct {
	p   *planner.Planner
	c   *simConnector
	err error
}

func newPlannerScaler(cfg planner.Config, m perf.Model, workers int, log *slog.Logger) *plannerScaler {
	c := &simConnector{desired: workers}
	p, err := planner.New(cfg, m, c, log)
	return &plannerScaler{p: p, c: c, err: err}
}

func (s *plannerScaler) Tick(_ time.Duration, w simulate.Window) int {
	if s.err != nil {
		return s.c.desired
	}
	s.c.ready = w.Serving
	if _, err := s.p.Step(context.Background(), observation(w)); err != nil {
		s.err = err
	}
	return s.c.desired
}

// reactiveScaler is planner.Reactive in the simulated loop.
type reactiveScaler struct {
	r *planner.Reactive
	c *simConnector
}

func (s *reactiveScaler) Tick(_ time.Duration, w simulate.Window) int {
	s.c.ready = w.Serving
	_, _ = s.r.Step(context.Background(), observation(w), w.KVUsage) // the connector does not fail
	return s.c.desired
}

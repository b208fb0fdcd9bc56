package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/connector/virtual"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/replay/simulate"
)

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

// virtualLoop is the outside system of a virtual connector, played by the
// simulation: each tick it acknowledges the pool's pending decision once
// the simulated workers run it (every one serving, none starting), lets
// the planner decide, and carries out the pending target.
type virtualLoop struct {
	store  *virtual.Memory
	conn   *virtual.Connector
	now    time.Time
	target int
}

func newVirtualLoop(workers int) *virtualLoop {
	l := &virtualLoop{store: virtual.NewMemory(), target: workers}
	l.conn = virtual.New(l.store, virtual.Config{Initial: map[planner.Pool]int{planner.Aggregated: workers},
		Now: func() time.Time { return l.now }})
	return l
}

// tick runs decide between the ack and the read-back of one tick.
func (l *virtualLoop) tick(w simulate.Window, decide func(ctx context.Context)) int {
	ctx := context.Background()
	l.now = simEpoch.Add(w.End)
	recs, _ := l.store.Latest(ctx) // Memory does not fail
	for _, r := range recs {
		if r.Pool == planner.Aggregated && r.Pending() && w.Serving == r.Target && w.Starting == 0 {
			_ = l.store.Ack(ctx, r.Pool, r.Seq, w.Serving) // within [AckSeq, Seq]
		}
	}
	decide(ctx)
	recs, _ = l.store.Latest(ctx)
	for _, r := range recs {
		if r.Pool == planner.Aggregated {
			l.target = r.Target
		}
	}
	return l.target
}

// plannerScaler is the SLO planner in the simulated loop, through the
// virtual connector: each tick's window becomes an Observation and Step
// decides. Step's errors (a change refused while the last one starts) are
// the planner's to retry on its next step.
type plannerScaler struct {
	p *planner.Planner
	l *virtualLoop
}

func newPlannerScaler(cfg planner.Config, m perf.Model, workers int, log *slog.Logger) (*plannerScaler, error) {
	l := newVirtualLoop(workers)
	p, err := planner.New(cfg, m, l.conn, log)
	if err != nil {
		return nil, err
	}
	return &plannerScaler{p: p, l: l}, nil
}

func (s *plannerScaler) Tick(_ time.Duration, w simulate.Window) int {
	return s.l.tick(w, func(ctx context.Context) { _, _ = s.p.Step(ctx, observation(w)) })
}

// reactiveScaler is planner.Reactive in the simulated loop, through the
// same virtual connector.
type reactiveScaler struct {
	r *planner.Reactive
	l *virtualLoop
}

func newReactiveScaler(cfg planner.ReactiveConfig, workers int) (*reactiveScaler, error) {
	l := newVirtualLoop(workers)
	r, err := planner.NewReactive(cfg, l.conn)
	if err != nil {
		return nil, err
	}
	return &reactiveScaler{r: r, l: l}, nil
}

func (s *reactiveScaler) Tick(_ time.Duration, w simulate.Window) int {
	return s.l.tick(w, func(ctx context.Context) { _, _ = s.r.Step(ctx, observation(w), w.KVUsage) })
}

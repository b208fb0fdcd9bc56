// Package planner sizes a deployment's worker pools to the load coming: it
// predicts the request rate and lengths from what the frontend observed,
// turns them into workers with planner/perf's model of a worker, and asks
// a Connector to scale, with hysteresis, a cooldown, an idle rule, respect
// for manual changes and an advisory mode that only publishes.
//
// The core scrapes nothing and scales nothing itself: scrapers make
// Observations (planner/scrape) and connectors carry out decisions
// (planner/connector/...). A Planner is driven by one goroutine; Status is
// safe to call from others.
package planner

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/planner/perf"
)

// Pool names a set of interchangeable workers.
type Pool string

// The pools a planner sizes.
const (
	Prefill    Pool = "prefill"
	Decode     Pool = "decode"
	Aggregated Pool = "aggregated"
)

// Mean is a sum and a count. A Count of 0 is an undefined mean, never a
// NaN: an idle window has no mean TTFT, and that is not a reason to stall.
type Mean struct{ Sum, Count float64 }

// Value is the mean, and false when it is undefined.
func (m Mean) Value() (float64, bool) {
	if m.Count <= 0 {
		return 0, false
	}
	return m.Sum / m.Count, true
}

// Observation is what the frontend saw in one window [Start, End). The
// counts are deltas of counters and always numbers. OK is false when the
// window could not be observed (a failed scrape): that is not idleness.
type Observation struct {
	Start, End time.Time
	OK         bool
	// Arrivals and Finished are requests that arrived and finished.
	Arrivals, Finished float64
	// PromptTokens are the arrivals' prompt tokens, CachedTokens those of
	// them a pool or the cache held, OutputTokens the tokens generated.
	PromptTokens, CachedTokens, OutputTokens float64
	// TTFT and ITL are in seconds.
	TTFT, ITL Mean
	// HitByTier are prompt tokens restored from each cache tier.
	HitByTier map[string]float64
	// QueueDepth is requests waiting for a worker at End.
	QueueDepth float64
}

// Replicas is a pool's size: what was asked for and what serves.
type Replicas struct {
	Desired int `json:"desired"`
	Ready   int `json:"ready"`
}

// Connector carries out decisions on a deployment.
type Connector interface {
	// Replicas is every pool's current size.
	Replicas(ctx context.Context) (map[Pool]Replicas, error)
	// Scale asks for n workers in pool p.
	Scale(ctx context.Context, p Pool, n int) error
}

// Limits bound one pool.
type Limits struct {
	Min int `json:"min"`
	Max int `json:"max"`
}

// ManualPolicy says what a manual change of a pool's size does: it is
// respected for Respect (the pool is frozen at the observed size), or,
// when Override is set, scaled back at once.
type ManualPolicy struct {
	Respect  time.Duration
	Override bool
}

// Modes of a planner.
const (
	ModeActive   = "active"
	ModeAdvisory = "advisory"
)

// Config is a planner's settings; zero fields take the defaults named.
type Config struct {
	// Mode is ModeActive (the default) or ModeAdvisory, which decides and
	// publishes but never scales.
	Mode string
	// Interval is one observation window. The default is 30 s.
	Interval time.Duration
	// StartupDelay is how long a new worker takes to serve; predictions
	// look that far ahead. The default is 60 s.
	StartupDelay time.Duration
	// Cooldown is the least time between a pool's change and its next
	// scale-down. The default is 5 min.
	Cooldown time.Duration
	// TTFT and ITL are the latency targets: ITL on the mean, TTFT on the
	// mean or, with TTFTQuantile q in (0, 1), on the q-quantile (a share q
	// of requests start within it: perf.Model.PrefillCapacityQ).
	TTFT, ITL time.Duration
	// TTFTQuantile is 0 (the default: the TTFT target is on the mean) or
	// in (0, 1).
	TTFTQuantile float64
	// Pools are the pools sized and their limits: {Aggregated} or
	// {Prefill, Decode}.
	Pools map[Pool]Limits
	// Budget bounds the workers of all pools together; 0 is no bound.
	Budget int
	// Predictor is the request-rate predictor's spec (planner/predict).
	// The default is "kalman".
	Predictor string
	// Band is the hysteresis: a pool shrinks to n only when its need ×
	// (1 + Band) ≤ n. The default is 0.15.
	Band float64
	// DownStable is the windows in a row a smaller size must suffice
	// before a scale-down. The default is 3.
	DownStable int
	// MaxDownStep bounds one scale-down; 0 is half the pool, rounded up.
	MaxDownStep int
	// IdleWindows is the windows without arrivals after which a pool goes
	// to its minimum, whatever the predictor says. The default is 2.
	IdleWindows int
	// Manual is what a manual change does. The default respects it for
	// 10 min.
	Manual ManualPolicy
	// Registry gets the planner's metrics (kvstrata_planner_*); nil is a
	// registry of the planner's own, Planner.Registry.
	Registry *prometheus.Registry
}

// Decision is one pool's outcome of a step.
type Decision struct {
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at"`
	Pool    Pool      `json:"pool"`
	Current int       `json:"current"`
	Target  int       `json:"target"`
	// Need is the fractional workers the model asked for.
	Need float64 `json:"need"`
	// Reason says why: "load", "idle", "manual", "budget",
	// "ttft-infeasible", "hold", "cooldown".
	Reason string `json:"reason"`
	Mode   string `json:"mode"`
	// Applied is whether the connector was asked to scale.
	Applied bool `json:"applied"`
}

// Planner is the loop's brain: Step takes one Observation and returns the
// decisions it made. Its state is in loop.go; Step is called by one
// goroutine, Status by any.
type Planner struct {
	cfg  Config
	m    perf.Model
	conn Connector
	log  *slog.Logger

	loop
}

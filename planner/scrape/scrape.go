// Package scrape turns what a frontend measured into planner.Observations:
// read from the frontend's /metrics directly (Frontend), by the deltas of
// its counters between two scrapes, or from a Prometheus server that
// scrapes it (API), by increase() over the window.
//
// An Observation never holds a NaN: a window without requests has zero
// counts and undefined means (Count 0). A scrape that fails, or finds no
// data at all, is an error, and the caller steps the planner with OK
// false, which holds every pool rather than scaling down blind. A counter
// that went backwards (the frontend restarted) counts from zero.
//
// A Frontend or an API is used by one goroutine at a time.
package scrape

import (
	"errors"
	"math"
)

// The frontend's series the planner reads (router/frontend/metrics.go).
const (
	Arrivals     = "kvstrata_frontend_arrivals_total"
	Finished     = "kvstrata_frontend_requests_total"
	PromptTokens = "kvstrata_frontend_prompt_tokens_total"
	CachedTokens = "kvstrata_frontend_cached_prompt_tokens_total"
	PrefixTokens = "kvstrata_frontend_routed_prefix_tokens_total" // by tier
	// OutputLengths is a histogram: its _sum is the output tokens of the
	// requests finished.
	OutputLengths = "kvstrata_frontend_output_sequence_tokens"
	TTFT          = "kvstrata_frontend_time_to_first_token_seconds"
	ITL           = "kvstrata_frontend_inter_token_latency_seconds"
	QueueDepth    = "kvstrata_frontend_queue_depth"
)

// Errors a scrape returns.
var (
	// ErrBaseline is a Frontend's first scrape: it has nothing to take
	// the counters' deltas from yet. It is not a failure.
	ErrBaseline = errors.New("scrape: first scrape, a baseline")
	// ErrNoData is a Prometheus server that has no arrivals series for
	// the window: it does not scrape the frontend (yet).
	ErrNoData = errors.New("scrape: no data")
	// ErrScrape marks a scrape that failed.
	ErrScrape = errors.New("scrape: failed")
)

// number is v, or 0 for a NaN, an infinity or a negative v: counts and
// sums of latencies are never negative.
func number(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}

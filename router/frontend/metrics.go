package frontend

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the frontend's Prometheus series.
type metrics struct {
	requests   *prometheus.CounterVec   // worker, outcome, route
	ttft       *prometheus.HistogramVec // worker, route
	itl        *prometheus.HistogramVec // worker
	e2e        *prometheus.HistogramVec // worker, route
	inputLen   *prometheus.HistogramVec // worker
	outputLen  *prometheus.HistogramVec // worker
	decisions  *prometheus.CounterVec   // worker, policy
	overlap    *prometheus.HistogramVec // tier (pool, hbm, dram, ssd, s3)
	migrations *prometheus.CounterVec   // cause
	queue      prometheus.Gauge
	healthy    *prometheus.GaugeVec // worker
	lookups    *prometheus.CounterVec
	// What the planner sizes workers by (planner/scrape reads them).
	arrivals     prometheus.Counter
	promptTokens prometheus.Counter
	cachedTokens prometheus.Counter
	prefixTokens *prometheus.CounterVec // tier (pool, hbm, dram, ssd, s3)
}

func newMetrics(reg prometheus.Registerer) *metrics {
	lat := prometheus.ExponentialBuckets(0.001, 2, 16) // 1 ms … 33 s
	lens := prometheus.ExponentialBuckets(1, 2, 18)    // 1 … 131072 tokens
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_frontend_requests_total",
			Help: "Requests served, by the worker that finished them, outcome (ok, error, cancelled) and route (aggregated; disaggregated: prefilled on a prefill worker; local: prefilled on the decode worker)."}, []string{"worker", "outcome", "route"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_time_to_first_token_seconds",
			Help: "From a request's arrival to its first token, by worker and route.", Buckets: lat}, []string{"worker", "route"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_inter_token_latency_seconds",
			Help: "Between a request's successive tokens, by worker.", Buckets: lat}, []string{"worker"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_request_duration_seconds",
			Help: "From a request's arrival to its last token, by worker and route.", Buckets: lat}, []string{"worker", "route"}),
		inputLen: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_input_sequence_tokens",
			Help: "Prompt lengths, by worker.", Buckets: lens}, []string{"worker"}),
		outputLen: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_output_sequence_tokens",
			Help: "Generated lengths, by worker.", Buckets: lens}, []string{"worker"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_frontend_routing_decisions_total",
			Help: "Routing decisions, by chosen worker and policy."}, []string{"worker", "policy"}),
		overlap: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvstrata_frontend_routed_overlap_blocks",
			Help:    "Per routing decision, the prompt's prefix blocks the chosen worker finds in its pool (tier=pool) or restores from each cache tier.",
			Buckets: lens}, []string{"tier"}),
		migrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_frontend_migrations_total",
			Help: "Requests moved to another worker, by cause (refused, status, broken, overloaded, stalled)."}, []string{"cause"}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvstrata_frontend_queue_depth",
			Help: "Requests waiting for a worker that is not busy."}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvstrata_frontend_worker_healthy",
			Help: "1 while a worker is a candidate, 0 while it is out after a failure."}, []string{"worker"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_frontend_cache_lookups_total",
			Help: "Cache lookups for routing, by outcome (ok, error: routed without tier credit)."}, []string{"outcome"}),
		arrivals: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstrata_frontend_arrivals_total",
			Help: "Requests accepted, counted on arrival (requests_total counts them when they end)."}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstrata_frontend_prompt_tokens_total",
			Help: "Prompt tokens of the requests accepted, counted on arrival."}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstrata_frontend_cached_prompt_tokens_total",
			Help: "Prompt tokens of finished requests that their worker did not compute (its pool or the cache held them), as the worker reports; not counted for requests prefilled on a prefill worker."}),
		prefixTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_frontend_routed_prefix_tokens_total",
			Help: "Per routing decision, prompt tokens of the prefix the chosen worker finds in its pool (tier=pool) or restores from each cache tier."}, []string{"tier"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.ttft, m.itl, m.e2e, m.inputLen, m.outputLen, m.decisions, m.overlap,
			m.migrations, m.queue, m.healthy, m.lookups, m.arrivals, m.promptTokens, m.cachedTokens, m.prefixTokens)
	}
	return m
}

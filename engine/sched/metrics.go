package sched

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/pool"
)

// The engine's Prometheus metrics. Where vLLM exports one, the name, type,
// unit and buckets are vLLM's (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger), so that a router or a dashboard built for vLLM
// reads ours; every one is labelled model_name (vLLM's served model name).
// vLLM's second label, engine (its engine-core index), is left out: a
// worker runs one loop.
//
//	vllm:num_requests_running           gauge    requests in the batch
//	vllm:num_requests_waiting           gauge    requests queued or onboarding (vLLM counts WAITING_FOR_REMOTE_KVS as waiting)
//	vllm:kv_cache_usage_perc            gauge    held pool blocks / all, 0–1
//	vllm:prefix_cache_queries_total     counter  tokens of admitted requests looked up in the pool
//	vllm:prefix_cache_hits_total        counter  of those, tokens found in the pool
//	vllm:num_preemptions_total          counter  requests preempted (by recompute)
//	vllm:prompt_tokens_total            counter  prompt tokens prefilled (once per request)
//	vllm:generation_tokens_total        counter  tokens generated
//	vllm:request_success_total          counter  requests ended, by finished_reason (stop, length, abort)
//	vllm:time_to_first_token_seconds    histogram arrival to first token
//	vllm:inter_token_latency_seconds    histogram between two tokens of a request
//	vllm:time_per_output_token_seconds  histogram the same intervals, under the name older vLLM exports
//	vllm:e2e_request_latency_seconds    histogram arrival to last token
//	vllm:request_queue_time_seconds     histogram arrival to (first) admission
//
// and the engine's own, about kvstrata:
//
//	kvstrata_engine_onboarded_tokens_total   counter tokens loaded from kvstrata into the pool
//	kvstrata_engine_recomputed_tokens_total  counter tokens kvstrata had (or was named for) but did not deliver, so computed
//	kvstrata_engine_cache_failures_total     counter Lookup, Load or Store calls that failed or timed out, as the engine saw them
//	kvstrata_engine_offloaded_blocks_total   counter blocks handed to the Connector to offload
//	kvstrata_engine_stored_blocks_total      counter blocks stored for a remote decode
//
// The connector's metrics (engine/kvconn) share the kvstrata_engine_ prefix
// and a worker registers both on one registry, so no name here may be one
// of its: kvconn's kvstrata_engine_cache_errors_total{op} counts its own
// failed operations by op, offloads included.
type metrics struct {
	running, waiting, usage            prometheus.Gauge
	queries, hits                      prometheus.Counter
	preemptions, prompt, generation    prometheus.Counter
	success                            *prometheus.CounterVec
	ttft, itl, tpot, e2e, queue        prometheus.Histogram
	onboarded, recomputed, cacheErrors prometheus.Counter
	offloaded, stored                  prometheus.Counter
	lastPool                           pool.Stats
	last                               counters
}

// vLLM's buckets.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	tokenBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// newMetrics registers the engine's metrics on reg; nil reg, nil metrics.
func newMetrics(reg prometheus.Registerer, modelName string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := prometheus.Labels{"model_name": modelName}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
	}
	m := &metrics{
		running:     gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:     gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:       gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		queries:     counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		hits:        counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preemptions: counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prompt:      counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generation:  counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"finished_reason"}),
		ttft:        hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:         hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tokenBuckets),
		tpot:        hist("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", tokenBuckets),
		e2e:         hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
		queue:       hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestBuckets),
		onboarded:   counter("kvstrata_engine_onboarded_tokens_total", "Prompt tokens whose KV was loaded from kvstrata into the worker's pool."),
		recomputed:  counter("kvstrata_engine_recomputed_tokens_total", "Prompt tokens kvstrata held or was named for but did not deliver (missing, corrupt, late, failed), so computed."),
		cacheErrors: counter("kvstrata_engine_cache_failures_total", "Cache calls of the engine (Lookup, Load, Store) that failed or timed out; it recomputed instead, or failed the handoff."),
		offloaded:   counter("kvstrata_engine_offloaded_blocks_total", "Full blocks the worker computed and handed to kvstrata to offload."),
		stored:      counter("kvstrata_engine_stored_blocks_total", "Prompt blocks stored in kvstrata for a remote decode worker."),
	}
	for _, r := range []FinishReason{FinishStop, FinishLength, FinishAbort} {
		m.success.WithLabelValues(string(r))
	}
	cs := []prometheus.Collector{
		m.running, m.waiting, m.usage, m.queries, m.hits, m.preemptions, m.prompt, m.generation,
		m.success, m.ttft, m.itl, m.tpot, m.e2e, m.queue,
		m.onboarded, m.recomputed, m.cacheErrors, m.offloaded, m.stored,
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("%w: Registerer: %w", ErrBadConfig, err)
		}
	}
	return m, nil
}

// observeState brings the gauges and counters up to the loop's state.
func (m *metrics) observeState(e *Engine) {
	if m == nil {
		return
	}
	m.running.Set(float64(len(e.running)))
	m.waiting.Set(float64(len(e.waiting) + e.onboarding()))
	ps := e.pool.Stats()
	m.usage.Set(ps.Usage)
	m.queries.Add(float64(ps.QueriedTokens - m.lastPool.QueriedTokens))
	m.hits.Add(float64(ps.HitTokens - m.lastPool.HitTokens))
	m.lastPool = ps
	c, l := e.counters, m.last
	m.preemptions.Add(float64(c.Preemptions - l.Preemptions))
	m.prompt.Add(float64(c.PromptTokens - l.PromptTokens))
	m.generation.Add(float64(c.GeneratedTokens - l.GeneratedTokens))
	m.onboarded.Add(float64(c.OnboardedTokens - l.OnboardedTokens))
	m.recomputed.Add(float64(c.RecomputedTokens - l.RecomputedTokens))
	m.cacheErrors.Add(float64(c.CacheErrors - l.CacheErrors))
	m.offloaded.Add(float64(c.OffloadedBlocks - l.OffloadedBlocks))
	m.stored.Add(float64(c.StoredBlocks - l.StoredBlocks))
	m.last = c
}

func (m *metrics) queued(d time.Duration) {
	if m != nil {
		m.queue.Observe(d.Seconds())
	}
}

func (m *metrics) firstToken(d time.Duration) {
	if m != nil {
		m.ttft.Observe(d.Seconds())
	}
}

func (m *metrics) nextToken(d time.Duration) {
	if m != nil {
		m.itl.Observe(d.Seconds())
		m.tpot.Observe(d.Seconds())
	}
}

// finished counts a request that ended.
func (m *metrics) finished(reason FinishReason, e2e time.Duration) {
	if m != nil {
		m.success.WithLabelValues(string(reason)).Inc()
		m.e2e.Observe(e2e.Seconds())
	}
}

package kvconn

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Conn's Prometheus collectors, every one labelled with the
// model_name of Config.ModelName:
//
//   - kvstrata_engine_onboard_blocks_total{tier}: blocks Load put intact
//     into the engine's memory, by the tier that served them (dram, ssd,
//     s3, … as the node says; "remote" for a block from a node other than
//     the worker's own whose tier is not known; "cache" for one from its
//     own node whose tier is not known).
//   - kvstrata_engine_onboard_bytes_total{tier}: their bytes.
//   - kvstrata_engine_offload_blocks_total: blocks stored in the cache by
//     Offload (in the background) and Store (write-through).
//   - kvstrata_engine_offload_bytes_total: their bytes.
//   - kvstrata_engine_offload_dropped_blocks_total: blocks Offload gave up
//     on: over the queue bound, refused by the node, or still queued when
//     Close's time ran out.
//   - kvstrata_engine_cache_errors_total{op}: failed cache operations, op
//     one of lookup, load, offload, store: the cache unreachable, a block
//     corrupt on arrival, a node refusing a block. A miss is no error.
//   - kvstrata_engine_onboard_seconds: the time of each Load that fetched
//     at least one block.
type metrics struct {
	onboardBlocks, onboardBytes *prometheus.CounterVec
	offloadBlocks, offloadBytes prometheus.Counter
	dropped                     prometheus.Counter
	errors                      *prometheus.CounterVec
	onboardSeconds              prometheus.Histogram
}

// Error ops of kvstrata_engine_cache_errors_total.
const (
	opLookup  = "lookup"
	opLoad    = "load"
	opOffload = "offload"
	opStore   = "store"
)

func newMetrics(model string) *metrics {
	labels := prometheus.Labels{"model_name": model}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvstrata", Subsystem: "engine", Name: name, Help: help, ConstLabels: labels})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvstrata", Subsystem: "engine", Name: name, Help: help, ConstLabels: labels}, []string{label})
	}
	m := &metrics{
		onboardBlocks: counterVec("onboard_blocks_total", "KV blocks onboarded from kvstrata into the engine's memory, by the tier that served them.", "tier"),
		onboardBytes:  counterVec("onboard_bytes_total", "KV bytes onboarded from kvstrata into the engine's memory, by the tier that served them.", "tier"),
		offloadBlocks: counter("offload_blocks_total", "KV blocks stored in kvstrata (offloaded in the background, or written through)."),
		offloadBytes:  counter("offload_bytes_total", "KV bytes stored in kvstrata (offloaded in the background, or written through)."),
		dropped:       counter("offload_dropped_blocks_total", "KV blocks not offloaded: over the queue bound, refused by the node, or left at close."),
		errors:        counterVec("cache_errors_total", "Failed kvstrata operations by op (lookup, load, offload, store); the engine recomputed instead.", "op"),
		onboardSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvstrata", Subsystem: "engine", Name: "onboard_seconds",
			Help: "Time to onboard a prompt's blocks from kvstrata (one Load that fetched at least one block).", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 18)}), // 100µs … 13s
	}
	for _, op := range []string{opLookup, opLoad, opOffload, opStore} {
		m.errors.WithLabelValues(op) // exported at 0 from the start
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	cs := []prometheus.Collector{m.onboardBlocks, m.onboardBytes, m.offloadBlocks, m.offloadBytes, m.dropped, m.errors, m.onboardSeconds}
	for i, c := range cs {
		if err := r.Register(c); err != nil {
			for _, done := range cs[:i] { // all or none
				r.Unregister(done)
			}
			return err
		}
	}
	return nil
}

func (m *metrics) onboard(tier string, bytes int) {
	m.onboardBlocks.WithLabelValues(tier).Inc()
	m.onboardBytes.WithLabelValues(tier).Add(float64(bytes))
}

func (m *metrics) offloaded(blocks, bytes int) {
	m.offloadBlocks.Add(float64(blocks))
	m.offloadBytes.Add(float64(bytes))
}

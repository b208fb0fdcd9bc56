package planner

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the planner's Prometheus series.
type metrics struct {
	desired, current, need *prometheus.GaugeVec // pool
	predicted              *prometheus.GaugeVec // series: rate, isl, osl, hit
	correction             *prometheus.GaugeVec // kind: prefill, decode
	decisions              *prometheus.CounterVec
	scrapeErrors           prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	g := func(name, help string, label string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{label})
	}
	m := &metrics{
		desired: g("kvstrata_planner_desired_replicas", "Workers the planner wants in each pool (in advisory mode, would want).", "pool"),
		current: g("kvstrata_planner_current_replicas", "Workers each pool has asked for, starting ones included, as the connector reports.", "pool"),
		need:    g("kvstrata_planner_need", "Fractional workers each pool needs for the predicted load within the TTFT and ITL targets.", "pool"),
		predicted: g("kvstrata_planner_predicted",
			"The load sized for: series rate (requests/s, the most over the lead time), isl and osl (mean tokens), hit (fraction of prompt tokens cached).", "series"),
		correction: g("kvstrata_planner_correction", "Observed over modelled latency that the profile's prefill and decode times are multiplied by.", "kind"),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvstrata_planner_decisions_total",
			Help: "Decisions to change a pool's size, by pool, direction (up, down) and whether the connector was asked (applied)."},
			[]string{"pool", "direction", "applied"}),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvstrata_planner_scrape_errors_total",
			Help: "Windows whose metrics could not be read; the planner held every pool through them."}),
	}
	for _, c := range []prometheus.Collector{m.desired, m.current, m.need, m.predicted, m.correction, m.decisions, m.scrapeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

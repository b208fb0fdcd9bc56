package planner

import (
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Status is what a planner last decided and why, for people and for
// GET /v1/planner/status. Every number is finite: an idle deployment has
// zeros, never NaN.
type Status struct {
	Mode string `json:"mode"`
	// At is the end of the last window stepped (zero before the first).
	At time.Time `json:"at"`
	// Decisions are the last step's, one per pool.
	Decisions []Decision `json:"decisions"`
	// ObservedRate is the last OK window's arrivals a second.
	ObservedRate float64             `json:"observed_rate"`
	Predicted    Predicted           `json:"predicted"`
	Corrections  Corrections         `json:"corrections"`
	Pools        map[Pool]PoolStatus `json:"pools"`
	// IdleWindows are the OK windows in a row without arrivals.
	IdleWindows int `json:"idle_windows"`
	// ScrapeErrors are the windows that could not be observed.
	ScrapeErrors int `json:"scrape_errors"`
}

// Predicted is the load the planner sizes for: the request rate over the
// lead time, mean prompt and output tokens (the last defined values) and
// the fraction of prompt tokens cached.
type Predicted struct {
	Rate float64 `json:"rate"`
	ISL  float64 `json:"isl"`
	OSL  float64 `json:"osl"`
	Hit  float64 `json:"hit"`
}

// Corrections are the observed-over-modelled latency factors the model's
// prefill and decode times are multiplied by, in [0.5, 4].
type Corrections struct {
	Prefill float64 `json:"prefill"`
	Decode  float64 `json:"decode"`
}

// PoolStatus is one pool's state.
type PoolStatus struct {
	Min     int     `json:"min"`
	Max     int     `json:"max"`
	Current int     `json:"current"`
	Target  int     `json:"target"`
	Need    float64 `json:"need"`
	// ManualUntil is when a respected manual change stops freezing the
	// pool; absent when none does.
	ManualUntil time.Time `json:"manual_until,omitzero"`
}

// Status is a copy of the planner's status; safe from any goroutine.
func (p *Planner) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.status
	s.Decisions = slices.Clone(s.Decisions)
	s.Pools = maps.Clone(s.Pools)
	return s
}

// publish records a step's outcome in the status and the metrics.
func (p *Planner) publish(ds []Decision, obs Observation, pred prediction, rate float64) {
	m := p.metrics
	predicted := Predicted{Rate: nonNeg(pred.Rate), ISL: nonNeg(p.isl.v), OSL: nonNeg(p.osl.v), Hit: nonNeg(p.hit.v)}
	m.predicted.WithLabelValues("rate").Set(predicted.Rate)
	m.predicted.WithLabelValues("isl").Set(predicted.ISL)
	m.predicted.WithLabelValues("osl").Set(predicted.OSL)
	m.predicted.WithLabelValues("hit").Set(predicted.Hit)
	m.correction.WithLabelValues("prefill").Set(p.cp)
	m.correction.WithLabelValues("decode").Set(p.cd)
	pools := map[Pool]PoolStatus{}
	for _, d := range ds {
		pool := string(d.Pool)
		m.desired.WithLabelValues(pool).Set(float64(d.Target))
		m.current.WithLabelValues(pool).Set(float64(d.Current))
		m.need.WithLabelValues(pool).Set(nonNeg(d.Need))
		dir := "none"
		switch {
		case d.Target > d.Current:
			dir = "up"
		case d.Target < d.Current:
			dir = "down"
		}
		if dir != "none" {
			m.decisions.With(prometheus.Labels{"pool": pool, "direction": dir, "applied": boolLabel(d.Applied)}).Inc()
		}
		l := p.cfg.Pools[d.Pool]
		pools[d.Pool] = PoolStatus{Min: l.Min, Max: l.Max, Current: d.Current, Target: d.Target, Need: nonNeg(d.Need),
			ManualUntil: p.pools[d.Pool].manualUntil}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.status
	s.At, s.Decisions, s.Pools = ds[0].At, ds, pools
	if obs.OK {
		s.ObservedRate = nonNeg(rate)
	}
	s.Predicted, s.Corrections = predicted, Corrections{Prefill: p.cp, Decode: p.cd}
	s.IdleWindows = p.idle
	if !obs.OK {
		s.ScrapeErrors++
	}
}

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

package perf

import "github.com/kvstrata/kvstrata/engine/model/sim"

// FromProfile is the model of the worker p was measured on: New with the
// limits of p.Worker, the defaults where p has none.
func FromProfile(p sim.Profile) (Model, error) {
	var lim sim.WorkerLimits
	if p.Worker != nil {
		lim = *p.Worker
	}
	return New(p, lim)
}

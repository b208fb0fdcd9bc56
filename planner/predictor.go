package planner

import (
	"fmt"
	"strconv"
	"strings"
)

// predictor forecasts the request rate, one value per window: Observe
// folds in a window's rate, Predict(h) is the rate h windows ahead.
type predictor interface {
	Observe(v float64)
	Predict(h int) float64
}

// newPredictor makes the rate predictor of a spec.
var newPredictor = func(spec string) (predictor, error) { return ewmaPredictor(spec) }

// ewma is a level without trend: "constant" is the last value (α = 1),
// "ewma:α" smooths.
type ewma struct {
	alpha, level float64
	seen         bool
}

func ewmaPredictor(spec string) (predictor, error) {
	name, arg, _ := strings.Cut(spec, ":")
	switch name {
	case "constant":
		return &ewma{alpha: 1}, nil
	case "ewma":
		a := 0.3
		if arg != "" {
			v, err := strconv.ParseFloat(arg, 64)
			if err != nil || !(v > 0 && v <= 1) {
				return nil, fmt.Errorf("%w: predictor %q: α must be in (0, 1]", ErrBadConfig, spec)
			}
			a = v
		}
		return &ewma{alpha: a}, nil
	}
	return nil, fmt.Errorf("%w: predictor %q is unknown: want constant or ewma[:α]", ErrBadConfig, spec)
}

func (e *ewma) Observe(v float64) {
	if !e.seen {
		e.level, e.seen = v, true
		return
	}
	e.level += e.alpha * (v - e.level)
}

func (e *ewma) Predict(int) float64 { return e.level }

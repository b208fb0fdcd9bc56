package planner

import (
	"fmt"

	"github.com/kvstrata/kvstrata/planner/predict"
)

// predictor forecasts the request rate, one value per window: Observe
// folds in a window's rate, Predict(h) is the rate h windows ahead.
// planner/predict's predictors are ones.
type predictor interface {
	Observe(v float64)
	Predict(h int) float64
}

// newPredictor makes the rate predictor of a spec (planner/predict's
// syntax); a bad spec is an error wrapping ErrBadConfig.
var newPredictor = func(spec string) (predictor, error) {
	p, err := predict.New(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: predictor: %w", ErrBadConfig, err)
	}
	return p, nil
}

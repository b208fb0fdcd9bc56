package predict

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/kvstrata/kvstrata/trace"
)

// Series is the arrival rate of reqs, in requests a second, in windows of
// window from the first request's timestamp on: the arrivals in each
// window divided by its length. A window without arrivals is 0. A
// window below one millisecond, or no requests, give no series.
func Series(reqs []trace.Request, window time.Duration) []float64 {
	w := window.Milliseconds()
	if w < 1 || len(reqs) == 0 {
		return nil
	}
	first, last := reqs[0].Timestamp, reqs[0].Timestamp
	for _, r := range reqs {
		first, last = min(first, r.Timestamp), max(last, r.Timestamp)
	}
	counts := make([]float64, (last-first)/w+1)
	for _, r := range reqs {
		counts[(r.Timestamp-first)/w]++
	}
	for i := range counts {
		counts[i] /= window.Seconds()
	}
	// The trace ends at its last request, so the last window is cut
	// short; less than half of it would read as a fall in load that never
	// happened.
	if n := len(counts); n > 1 && (last-first)-int64(n-1)*w < w/2 {
		counts = counts[:n-1]
	}
	return counts
}

// Score is how well a predictor forecast a series.
type Score struct {
	MAE  float64 `json:"mae"`  // mean absolute error, in the series' unit
	RMSE float64 `json:"rmse"` // root mean square error
	// MAPE is the mean absolute error relative to the actual value, over
	// the windows whose actual value is above 0, as a fraction.
	MAPE float64 `json:"mape"`
	// Under is the share of windows predicted more than 10 % below the
	// actual value: those a planner would have under-provisioned.
	Under float64 `json:"under"`
	N     int     `json:"n"` // windows scored
}

// UnderTolerance is how far below the actual value a prediction may fall
// before Backtest counts it as under-predicted.
const UnderTolerance = 0.10

// Backtest feeds series to p one value at a time and, once p has seen
// warm values, scores each prediction h windows ahead against the value
// that came. p should be fresh.
func Backtest(p Predictor, series []float64, warm, h int) Score {
	h = max(h, 1)
	var s Score
	var abs, sq, ape float64
	var apeN, under int
	for i, v := range series {
		p.Observe(v)
		if i+1 < warm || i+h >= len(series) {
			continue
		}
		pred, actual := p.Predict(h), series[i+h]
		err := pred - actual
		abs += math.Abs(err)
		sq += err * err
		if actual > 0 {
			ape += math.Abs(err) / actual
			apeN++
		}
		if pred < (1-UnderTolerance)*actual {
			under++
		}
		s.N++
	}
	if s.N == 0 {
		return s
	}
	n := float64(s.N)
	s.MAE, s.RMSE, s.Under = abs/n, math.Sqrt(sq/n), float64(under)/n
	if apeN > 0 {
		s.MAPE = ape / float64(apeN)
	}
	return s
}

// All is the specs of every kind with the parameters the backtest uses,
// for a series whose season is period windows long (at least 2).
func All(period int) []string {
	return slices.Clone([]string{"constant", "ma:6", "holt:0.5,0.1", "kalman", "holt-winters:period=" + strconv.Itoa(max(period, 2)), "arima", "arima:1,1,1"})
}

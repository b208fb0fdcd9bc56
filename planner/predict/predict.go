// Package predict forecasts a time series of load, such as requests a
// second per window, a few windows ahead, so the planner can start workers
// before the load arrives.
//
// A Predictor is fed one observation a window (Observe) and asked for the
// value h windows after the last one (Predict). Make one from a spec with
// New:
//
//	constant                          the last value
//	ma:N                              the mean of the last N values
//	ewma[:a]                          exponential smoothing of the level (a 0.3)
//	holt:a,b                          Holt's linear trend (level a, trend b)
//	kalman[:q_level,q_trend,r]        a Kalman filter on level and trend
//	holt-winters:period=P[,a,b,g]     additive seasonal Holt-Winters
//	arima                             ARIMA(p,d,q), order chosen from the data
//	arima:p,d,q                       ARIMA of a fixed order
//
// Every prediction is a finite number ≥ 0 (load is never negative, and an
// empty series predicts 0). A Predictor is not safe for concurrent use.
package predict

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Predictor forecasts a series one observation at a time.
type Predictor interface {
	// Observe appends the next value of the series. NaN and ±Inf are
	// ignored: a window without a measurement is no evidence.
	Observe(v float64)
	// Predict is the value h ≥ 1 observations after the last, ≥ 0. An h
	// below 1 is read as 1.
	Predict(h int) float64
	// Name is the spec that makes an equivalent predictor, with every
	// default filled in.
	Name() string
}

// ErrBadSpec marks a spec New cannot parse; test with errors.Is.
var ErrBadSpec = errors.New("predict: bad predictor spec")

// Kinds lists the predictor kinds New knows, in the order the backtest
// reports them.
var Kinds = []string{"constant", "ma", "ewma", "holt", "kalman", "holt-winters", "arima"}

// Defaults of the parameters a spec may leave out.
const (
	DefaultEWMAAlpha = 0.3
	DefaultHoltAlpha = 0.5
	DefaultHoltBeta  = 0.1
	// The Kalman filter's noise: the level's and the trend's process noise
	// and the measurement noise, as variances. Only their ratios matter
	// to the gain, so these suit a series of any scale.
	DefaultKalmanQLevel = 0.1
	DefaultKalmanQTrend = 0.01
	DefaultKalmanR      = 1
	DefaultHWAlpha      = 0.3
	DefaultHWBeta       = 0.05
	DefaultHWGamma      = 0.3
	// MaxWindow bounds ma:N and holt-winters' period.
	MaxWindow = 100000
)

// New makes the predictor spec describes (see the package comment).
func New(spec string) (Predictor, error) {
	kind, args, hasArgs := strings.Cut(strings.TrimSpace(spec), ":")
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrBadSpec, spec, fmt.Sprintf(format, a...))
	}
	var nums []float64
	parseNums := func(want ...int) error {
		if !hasArgs {
			return nil
		}
		for _, s := range strings.Split(args, ",") {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return bad("%q is not a number", s)
			}
			nums = append(nums, f)
		}
		for _, w := range want {
			if len(nums) == w {
				return nil
			}
		}
		return bad("want %s, got %d", counts(want), len(nums))
	}
	switch kind {
	case "constant":
		if hasArgs {
			return nil, bad("constant takes no parameters")
		}
		return &constant{}, nil
	case "ma":
		if !hasArgs {
			return nil, bad("want ma:N, the number of values to average")
		}
		n, err := strconv.Atoi(strings.TrimSpace(args))
		if err != nil || n < 1 || n > MaxWindow {
			return nil, bad("N must be a whole number in [1, %d]", MaxWindow)
		}
		return &movingAverage{n: n}, nil
	case "ewma":
		if err := parseNums(0, 1); err != nil {
			return nil, err
		}
		a := DefaultEWMAAlpha
		if len(nums) == 1 {
			a = nums[0]
		}
		if err := smoothing(bad, "a", a); err != nil {
			return nil, err
		}
		return &ewma{alpha: a}, nil
	case "holt":
		if err := parseNums(0, 2); err != nil {
			return nil, err
		}
		a, b := DefaultHoltAlpha, DefaultHoltBeta
		if len(nums) == 2 {
			a, b = nums[0], nums[1]
		}
		if err := smoothing(bad, "a", a, "b", b); err != nil {
			return nil, err
		}
		return &holt{alpha: a, beta: b}, nil
	case "kalman":
		if err := parseNums(0, 3); err != nil {
			return nil, err
		}
		ql, qt, r := DefaultKalmanQLevel, DefaultKalmanQTrend, float64(DefaultKalmanR)
		if len(nums) == 3 {
			ql, qt, r = nums[0], nums[1], nums[2]
		}
		if ql < 0 || qt < 0 || r <= 0 || ql > 1e12 || qt > 1e12 || r > 1e12 {
			return nil, bad("q_level and q_trend must be in [0, 1e12], r in (0, 1e12]")
		}
		return newKalman(ql, qt, r), nil
	case "holt-winters":
		return parseHoltWinters(args, hasArgs, bad)
	case "arima":
		if !hasArgs {
			return &autoARIMA{}, nil
		}
		if err := parseNums(3); err != nil {
			return nil, err
		}
		p, d, q := nums[0], nums[1], nums[2]
		if !whole(p) || !whole(d) || !whole(q) || p < 0 || p > MaxP || d < 0 || d > MaxD || q < 0 || q > MaxQ {
			return nil, bad("want whole numbers p in [0, %d], d in [0, %d], q in [0, %d]", MaxP, MaxD, MaxQ)
		}
		return &arima{order: order{int(p), int(d), int(q)}}, nil
	case "":
		return nil, bad("empty; want one of %s", strings.Join(Kinds, ", "))
	}
	return nil, bad("unknown kind %q; want one of %s", kind, strings.Join(Kinds, ", "))
}

func counts(want []int) string {
	s := make([]string, len(want))
	for i, w := range want {
		s[i] = strconv.Itoa(w)
	}
	return strings.Join(s, " or ") + " parameters"
}

func whole(f float64) bool { return f == math.Trunc(f) }

func smoothing(bad func(string, ...any) error, kv ...any) error {
	for i := 0; i < len(kv); i += 2 {
		if v := kv[i+1].(float64); !(v > 0 && v <= 1) {
			return bad("%s is %v, must be in (0, 1]", kv[i], v)
		}
	}
	return nil
}

func parseHoltWinters(args string, hasArgs bool, bad func(string, ...any) error) (Predictor, error) {
	if !hasArgs {
		return nil, bad("want holt-winters:period=P[,a,b,g]")
	}
	hw := &holtWinters{alpha: DefaultHWAlpha, beta: DefaultHWBeta, gamma: DefaultHWGamma}
	// Numbers without a key are a, b and g, in that order.
	positional := []string{"a", "b", "g"}
	seen := map[string]bool{}
	for i, part := range strings.Split(args, ",") {
		k, v, isKV := strings.Cut(strings.TrimSpace(part), "=")
		if !isKV {
			if i == 0 || len(positional) == 0 {
				return nil, bad("%q: want period=P first, then up to three numbers a,b,g", part)
			}
			k, v, positional = positional[0], part, positional[1:]
		}
		k = strings.TrimSpace(k)
		if seen[k] {
			return nil, bad("%s given twice", k)
		}
		seen[k] = true
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, bad("%s: %q is not a number", k, v)
		}
		switch k {
		case "period":
			if !whole(f) || f < 2 || f > MaxWindow {
				return nil, bad("period must be a whole number of observations in [2, %d]", MaxWindow)
			}
			hw.period = int(f)
		case "a":
			hw.alpha = f
		case "b":
			hw.beta = f
		case "g":
			hw.gamma = f
		default:
			return nil, bad("unknown parameter %q; want period, a, b, g", k)
		}
	}
	if hw.period == 0 {
		return nil, bad("period=P is required")
	}
	if err := smoothing(bad, "a", hw.alpha, "b", hw.beta, "g", hw.gamma); err != nil {
		return nil, err
	}
	hw.warm = holt{alpha: hw.alpha, beta: hw.beta}
	return hw, nil
}

// clean is a prediction made safe: NaN and negative values are 0, +Inf
// the largest float.
func clean(v float64) float64 {
	switch {
	case math.IsNaN(v) || v < 0:
		return 0
	case math.IsInf(v, 1):
		return math.MaxFloat64
	}
	return v
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func fmtF(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// constant predicts the last value.
type constant struct{ last float64 }

func (c *constant) Observe(v float64) {
	if finite(v) {
		c.last = v
	}
}
func (c *constant) Predict(int) float64 { return clean(c.last) }
func (c *constant) Name() string        { return "constant" }

// movingAverage predicts the mean of the last n values.
type movingAverage struct {
	n    int
	ring []float64
	next int
	sum  float64
}

func (m *movingAverage) Observe(v float64) {
	if !finite(v) {
		return
	}
	if len(m.ring) < m.n {
		m.ring = append(m.ring, v)
	} else {
		m.ring[m.next] = v
		m.next = (m.next + 1) % m.n
	}
	// Summed afresh: a running sum drifts over a long series.
	m.sum = 0
	for _, x := range m.ring {
		m.sum += x
	}
}

func (m *movingAverage) Predict(int) float64 {
	if len(m.ring) == 0 {
		return 0
	}
	return clean(m.sum / float64(len(m.ring)))
}
func (m *movingAverage) Name() string { return "ma:" + strconv.Itoa(m.n) }

// ewma is simple exponential smoothing: a level without trend.
type ewma struct {
	alpha, level float64
	seen         bool
}

func (e *ewma) Observe(v float64) {
	if !finite(v) {
		return
	}
	if !e.seen {
		e.level, e.seen = v, true
		return
	}
	e.level += e.alpha * (v - e.level)
}

func (e *ewma) Predict(int) float64 { return clean(e.level) }
func (e *ewma) Name() string        { return "ewma:" + fmtF(e.alpha) }

// holt is Holt's linear trend: a level and a trend, each smoothed
// exponentially.
type holt struct {
	alpha, beta  float64
	level, trend float64
	n            int
}

func (h *holt) Observe(v float64) {
	if !finite(v) {
		return
	}
	switch h.n {
	case 0:
		h.level = v
	case 1:
		h.trend = v - h.level
		h.level = v
	default:
		prev := h.level
		h.level = h.alpha*v + (1-h.alpha)*(h.level+h.trend)
		h.trend = h.beta*(h.level-prev) + (1-h.beta)*h.trend
	}
	h.n++
}

func (h *holt) Predict(k int) float64 {
	if h.n == 0 {
		return 0
	}
	return clean(h.level + float64(max(k, 1))*h.trend)
}

func (h *holt) Name() string { return "holt:" + fmtF(h.alpha) + "," + fmtF(h.beta) }

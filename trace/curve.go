package trace

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ErrBadCurve marks a curve spec ParseCurve cannot read; test with
// errors.Is.
var ErrBadCurve = errors.New("trace: bad rate curve")

// Curve is a relative request rate over time, the shape Rescale gives a
// trace's arrivals. Only its shape matters: Rescale scales it to the
// trace's request count.
type Curve struct {
	spec string
	// steps: rate[i] from at[i] seconds on (at[0] = 0).
	at, rate []float64
	// day: period, min and sharp; period 0 for steps.
	period, min, sharp float64
}

// Defaults of a day curve's parameters.
const (
	DefaultDayMin   = 0.1
	DefaultDaySharp = 2.0
)

// ParseCurve reads a curve:
//
//	steps:R@T,R@T,…        rate R (≥ 0) from T seconds on; the first T is 0,
//	                        the Ts increase, and some R is above 0
//	day:period=P[,min=M][,sharp=S]
//	                        min + (1−min)·((1 − cos 2πt/P)/2)^sharp: a
//	                        trough at t = 0 and every P seconds, a peak of
//	                        1 half a period later; M in [0, 1] (default
//	                        0.1), S in (0, 100] (default 2), P in
//	                        [1, 1e9]
//
// With min 0.1 and sharp 2 the mean rate is 0.44 of the peak.
func ParseCurve(spec string) (Curve, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrBadCurve, spec, fmt.Sprintf(format, a...))
	}
	kind, args, _ := strings.Cut(strings.TrimSpace(spec), ":")
	c := Curve{spec: strings.TrimSpace(spec)}
	switch kind {
	case "steps":
		positive := false
		for _, part := range strings.Split(args, ",") {
			rs, ts, ok := strings.Cut(strings.TrimSpace(part), "@")
			if !ok {
				return Curve{}, bad("%q: want RATE@SECONDS", part)
			}
			r, err1 := strconv.ParseFloat(rs, 64)
			t, err2 := strconv.ParseFloat(ts, 64)
			if err1 != nil || err2 != nil || !finite(r) || !finite(t) || r < 0 || r > 1e9 || t < 0 || t > 1e9 {
				return Curve{}, bad("%q: want a rate in [0, 1e9] and a time in seconds in [0, 1e9]", part)
			}
			if len(c.at) == 0 && t != 0 {
				return Curve{}, bad("the first step starts at %v s, want 0", t)
			}
			if len(c.at) > 0 && t <= c.at[len(c.at)-1] {
				return Curve{}, bad("step at %v s does not come after the one at %v s", t, c.at[len(c.at)-1])
			}
			c.at, c.rate = append(c.at, t), append(c.rate, r)
			positive = positive || r > 0
		}
		if !positive {
			return Curve{}, bad("every rate is 0")
		}
	case "day":
		c.min, c.sharp = DefaultDayMin, DefaultDaySharp
		seen := map[string]bool{}
		for _, part := range strings.Split(args, ",") {
			k, vs, ok := strings.Cut(strings.TrimSpace(part), "=")
			v, err := strconv.ParseFloat(strings.TrimSpace(vs), 64)
			if !ok || err != nil || !finite(v) {
				return Curve{}, bad("%q: want KEY=NUMBER", part)
			}
			if seen[k] {
				return Curve{}, bad("%s given twice", k)
			}
			seen[k] = true
			switch k {
			case "period":
				if v < 1 || v > 1e9 {
					return Curve{}, bad("period %v: want seconds in [1, 1e9]", v)
				}
				c.period = v
			case "min":
				if v < 0 || v > 1 {
					return Curve{}, bad("min %v: want a fraction of the peak in [0, 1]", v)
				}
				c.min = v
			case "sharp":
				if v <= 0 || v > 100 {
					return Curve{}, bad("sharp %v: want an exponent in (0, 100]", v)
				}
				c.sharp = v
			default:
				return Curve{}, bad("unknown parameter %q; want period, min, sharp", k)
			}
		}
		if c.period == 0 {
			return Curve{}, bad("period=SECONDS is required")
		}
	default:
		return Curve{}, bad("want steps:RATE@SECONDS,… or day:period=SECONDS[,min=M][,sharp=S]")
	}
	return c, nil
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// String is the spec the curve was parsed from.
func (c Curve) String() string { return c.spec }

// Rate is the curve's relative rate t seconds from the start, ≥ 0.
func (c Curve) Rate(t float64) float64 {
	if c.period > 0 {
		wave := (1 - math.Cos(2*math.Pi*t/c.period)) / 2
		return c.min + (1-c.min)*math.Pow(wave, c.sharp)
	}
	i := sort.SearchFloat64s(c.at, t)
	if i == len(c.at) || c.at[i] > t {
		i--
	}
	if i < 0 {
		return 0
	}
	return c.rate[i]
}

// RescaleStep is the grid on which Rescale integrates the curve.
const RescaleStep = 100 * time.Millisecond

// Rescale gives reqs new timestamps so that their arrival rate follows c
// over duration d: request i, the i-th by timestamp (ties kept together),
// arrives when the curve's integral reaches the share of requests before
// it. The warp keeps the requests' order, their groups of equal
// timestamps and every other field; only the timestamps change, in
// milliseconds from 0, non-decreasing. Requests are returned ordered by
// their old timestamps (file order among equal ones), which is file order
// for a trace whose timestamps never decrease. reqs is not modified.
//
// It fails if d is below RescaleStep or the curve is 0 over all of d.
func Rescale(reqs []Request, c Curve, d time.Duration) ([]Request, error) {
	if d < RescaleStep {
		return nil, fmt.Errorf("trace: rescale over %v: want at least %v", d, RescaleStep)
	}
	// cum[k] is the curve's integral over the first k grid steps.
	step := RescaleStep.Seconds()
	n := int(math.Ceil(d.Seconds() / step))
	cum := make([]float64, n+1)
	for k := range n {
		a, b := float64(k)*step, min(float64(k+1)*step, d.Seconds())
		cum[k+1] = cum[k] + c.integral(a, b)
	}
	total := cum[n]
	if !(total > 0) {
		return nil, fmt.Errorf("trace: rescale: the curve %s is 0 over all of %v", c, d)
	}
	out := slices.Clone(reqs)
	slices.SortStableFunc(out, func(a, b Request) int { return cmpInt(a.Timestamp, b.Timestamp) })
	old := make([]int64, len(out))
	for i, r := range out {
		old[i] = r.Timestamp
	}
	before := 0 // requests with an older timestamp than out[i]
	for i := range out {
		if i > 0 && old[i] != old[i-1] {
			before = i
		}
		target := total * float64(before) / float64(len(out))
		// The first grid point whose integral reaches target, then linear
		// within the step before it.
		k := sort.SearchFloat64s(cum, target)
		var t float64
		switch {
		case k == 0:
			t = 0
		case k > n:
			t = d.Seconds()
		default:
			lo, hi := cum[k-1], cum[k]
			frac := 0.0
			if hi > lo {
				frac = (target - lo) / (hi - lo)
			}
			t = (float64(k-1) + frac) * step
		}
		out[i].Timestamp = int64(math.Round(min(t, d.Seconds()) * 1000))
	}
	for i := 1; i < len(out); i++ {
		// Rounding cannot reorder, but keep the promise explicit.
		out[i].Timestamp = max(out[i].Timestamp, out[i-1].Timestamp)
	}
	return out, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// integral is the curve's integral from a to b seconds: exact over steps
// (a step boundary may fall inside), Simpson's rule on pieces of at most
// a thousandth of the period for a day curve.
func (c Curve) integral(a, b float64) float64 {
	if c.period > 0 {
		n := min(max(1, int(math.Ceil((b-a)/(c.period/1000)))), 1000)
		h := (b - a) / float64(n)
		s := 0.0
		for i := range n {
			x := a + float64(i)*h
			s += h / 6 * (c.Rate(x) + 4*c.Rate(x+h/2) + c.Rate(x+h))
		}
		return s
	}
	s := 0.0
	for i := range c.at {
		lo := c.at[i]
		hi := math.Inf(1)
		if i+1 < len(c.at) {
			hi = c.at[i+1]
		}
		if x, y := max(a, lo), min(b, hi); y > x {
			s += c.rate[i] * (y - x)
		}
	}
	return s
}

package predict

import (
	"math"
	"math/cmplx"
	"strconv"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize"
)

// The largest ARIMA orders New accepts and the automatic search tries.
const (
	MaxP = 3
	MaxD = 1
	MaxQ = 2
	// RefitEvery is how many observations an ARIMA predictor takes between
	// fits: fitting is the expensive part.
	RefitEvery = 10
	// MaxHistory is how many of the latest observations ARIMA fits on.
	MaxHistory = 1000
	// kpssCritical is the KPSS statistic's 5 % critical value for level
	// stationarity (Kwiatkowski et al. 1992, table 1).
	kpssCritical = 0.463
)

type order struct{ p, d, q int }

func (o order) String() string {
	return strconv.Itoa(o.p) + "," + strconv.Itoa(o.d) + "," + strconv.Itoa(o.q)
}

// minPoints is how many observations a fit of o needs; with fewer an ARIMA
// predictor predicts as Holt does.
func (o order) minPoints() int { return max(10, 3*(o.p+o.q+1)+o.d+o.p) }

// fit is an ARIMA model fitted by conditional sum of squares.
type fit struct {
	order
	phi, theta []float64
	mu         float64 // the mean of the differenced series
	sigma2     float64 // the residuals' variance
	aic        float64
	ok         bool
}

// history is the observations an ARIMA predictor keeps, and the Holt
// predictor it falls back to while there are too few.
type history struct {
	xs    []float64
	since int // observations since the last fit
	holt  holt
}

func (h *history) observe(v float64) bool {
	if !finite(v) {
		return false
	}
	if h.holt.alpha == 0 {
		h.holt = holt{alpha: DefaultHoltAlpha, beta: DefaultHoltBeta}
	}
	h.holt.Observe(v)
	h.xs = append(h.xs, v)
	if len(h.xs) > 2*MaxHistory {
		h.xs = append(h.xs[:0], h.xs[len(h.xs)-MaxHistory:]...)
	}
	h.since++
	return true
}

func (h *history) window() []float64 {
	if len(h.xs) > MaxHistory {
		return h.xs[len(h.xs)-MaxHistory:]
	}
	return h.xs
}

// arima is ARIMA(p,d,q) of a fixed order, refitted every RefitEvery
// observations.
type arima struct {
	order
	h   history
	fit fit
}

func (a *arima) Observe(v float64) {
	if !a.h.observe(v) {
		return
	}
	if (!a.fit.ok || a.h.since >= RefitEvery) && len(a.h.xs) >= a.minPoints() {
		a.fit = fitCSS(a.h.window(), a.order)
		a.h.since = 0
	}
}

func (a *arima) Predict(h int) float64 {
	if !a.fit.ok {
		return a.h.holt.Predict(h)
	}
	return clean(a.fit.forecast(a.h.window(), max(h, 1)))
}

func (a *arima) Name() string { return "arima:" + a.order.String() }

// autoARIMA chooses its order from the data at each refit: d by the KPSS
// test (differenced once if the levels are not stationary), then p ≤ MaxP
// and q ≤ MaxQ by the lowest AIC. AIC compares models of one series only,
// so it cannot choose d, which changes the series.
type autoARIMA struct {
	h   history
	fit fit
}

func (a *autoARIMA) Observe(v float64) {
	if !a.h.observe(v) {
		return
	}
	if (a.fit.ok && a.h.since < RefitEvery) || len(a.h.xs) < (order{}).minPoints() {
		return
	}
	a.fit = fitAuto(a.h.window())
	a.h.since = 0
}

func (a *autoARIMA) Predict(h int) float64 {
	if !a.fit.ok {
		return a.h.holt.Predict(h)
	}
	return clean(a.fit.forecast(a.h.window(), max(h, 1)))
}

func (a *autoARIMA) Name() string { return "arima" }

// Order is the order the last fit chose, and whether there was one.
func (a *autoARIMA) Order() (p, d, q int, ok bool) {
	return a.fit.p, a.fit.d, a.fit.q, a.fit.ok
}

func fitAuto(xs []float64) fit {
	d := 0
	if !kpssStationary(xs) {
		d = 1
	}
	best := fit{}
	for p := 0; p <= MaxP; p++ {
		for q := 0; q <= MaxQ; q++ {
			o := order{p, d, q}
			if len(xs) < o.minPoints() {
				continue
			}
			if f := fitCSS(xs, o); f.ok && (!best.ok || f.aic < best.aic) {
				best = f
			}
		}
	}
	return best
}

// kpssStationary is the KPSS test of level stationarity at 5 %: the
// partial sums of the demeaned series, against its long-run variance
// (Newey–West, Bartlett weights, lag ⌊3√n/13⌋ as auto.arima takes).
func kpssStationary(xs []float64) bool {
	n := len(xs)
	m := mean(xs)
	var s, num, g0 float64
	for _, x := range xs {
		s += x - m
		num += s * s
		g0 += (x - m) * (x - m)
	}
	lags := int(3 * math.Sqrt(float64(n)) / 13)
	lr := g0 / float64(n)
	for l := 1; l <= lags; l++ {
		var g float64
		for t := l; t < n; t++ {
			g += (xs[t] - m) * (xs[t-l] - m)
		}
		lr += 2 * (1 - float64(l)/float64(lags+1)) * g / float64(n)
	}
	if lr <= 0 {
		return true // a constant series is stationary
	}
	return num/(float64(n)*float64(n)*lr) < kpssCritical
}

func difference(xs []float64, d int) []float64 {
	y := xs
	for range d {
		z := make([]float64, len(y)-1)
		for i := range z {
			z[i] = y[i+1] - y[i]
		}
		y = z
	}
	return y
}

// fitCSS fits o to xs by conditional sum of squares: the series is
// differenced d times and demeaned, the first p residuals and the
// residuals before the start taken as 0, and φ, θ minimised by
// Nelder–Mead with a penalty outside the stationary and invertible
// region.
func fitCSS(xs []float64, o order) fit {
	y := difference(xs, o.d)
	f := fit{order: o, mu: mean(y)}
	y = append([]float64(nil), y...) // xs itself when d = 0
	for i := range y {
		y[i] -= f.mu
	}
	m := len(y) - o.p
	if m < 2 {
		return fit{}
	}
	k := o.p + o.q
	e := make([]float64, len(y))
	sse := func(par []float64) float64 {
		phi, theta := par[:o.p], par[o.p:]
		if r := maxRoot(phi); r >= 0.99 {
			return 1e100 * (1 + r)
		}
		neg := make([]float64, len(theta))
		for i, t := range theta {
			neg[i] = -t
		}
		if r := maxRoot(neg); r >= 0.99 {
			return 1e100 * (1 + r)
		}
		s := 0.0
		for t := range y {
			if t < o.p {
				e[t] = 0
				continue
			}
			v := y[t]
			for i, c := range phi {
				v -= c * y[t-1-i]
			}
			for j, c := range theta {
				if t-1-j >= 0 {
					v -= c * e[t-1-j]
				}
			}
			e[t] = v
			s += v * v
		}
		if !finite(s) {
			return 1e100
		}
		return s
	}
	par := make([]float64, k)
	best := sse(par)
	if k > 0 {
		res, err := optimize.Minimize(optimize.Problem{Func: sse}, par,
			&optimize.Settings{FuncEvaluations: 400 * k}, &optimize.NelderMead{})
		if res != nil && finite(res.F) && res.F <= best {
			par, best = res.X, res.F
		}
		_ = err // a run stopped by its evaluation limit still improved par
	}
	f.phi, f.theta = par[:o.p], par[o.p:]
	f.sigma2 = best / float64(m)
	if !(f.sigma2 >= 0) || best >= 1e99 {
		return fit{}
	}
	// A perfect fit has no variance to take the log of.
	f.aic = float64(m)*math.Log(max(f.sigma2, 1e-300)) + 2*float64(k+1)
	f.ok = true
	return f
}

// maxRoot is the largest modulus of the inverse roots of
// 1 − c₁z − … − c_k z^k, the eigenvalues of its companion matrix: below 1
// the process is stationary.
func maxRoot(c []float64) float64 {
	switch len(c) {
	case 0:
		return 0
	case 1:
		return math.Abs(c[0])
	}
	k := len(c)
	a := mat.NewDense(k, k, nil)
	for j, v := range c {
		a.Set(0, j, v)
	}
	for i := 1; i < k; i++ {
		a.Set(i, i-1, 1)
	}
	var eig mat.Eigen
	if !eig.Factorize(a, mat.EigenNone) {
		return math.Inf(1)
	}
	r := 0.0
	for _, v := range eig.Values(nil) {
		r = max(r, cmplx.Abs(v))
	}
	return r
}

// forecast is the value h steps after the end of xs: the differenced
// series extended with future shocks 0, then integrated back.
func (f fit) forecast(xs []float64, h int) float64 {
	y := difference(xs, f.d)
	z := make([]float64, len(y), len(y)+h)
	for i := range y {
		z[i] = y[i] - f.mu
	}
	e := make([]float64, len(z), len(z)+h)
	for t := range z {
		if t < f.p {
			continue
		}
		v := z[t]
		for i, c := range f.phi {
			v -= c * z[t-1-i]
		}
		for j, c := range f.theta {
			if t-1-j >= 0 {
				v -= c * e[t-1-j]
			}
		}
		e[t] = v
	}
	for range h {
		t := len(z)
		v := 0.0
		for i, c := range f.phi {
			if t-1-i >= 0 {
				v += c * z[t-1-i]
			}
		}
		for j, c := range f.theta {
			if t-1-j >= 0 {
				v += c * e[t-1-j]
			}
		}
		z = append(z, v)
		e = append(e, 0)
	}
	if f.d == 0 {
		return z[len(z)-1] + f.mu
	}
	// d = 1: the last level plus the h forecast differences.
	level := xs[len(xs)-1]
	for _, v := range z[len(y):] {
		level += v + f.mu
	}
	return level
}

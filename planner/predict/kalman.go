package predict

import (
	"gonum.org/v1/gonum/mat"
)

// kalman is a local linear trend model: the state is [level, trend], the
// level moves by the trend each step, both take process noise, and each
// observation is the level plus measurement noise.
//
//	x' = F x + w,  F = [[1, 1], [0, 1]],  w ~ N(0, Q = diag(q_level, q_trend))
//	z  = H x + v,  H = [1, 0],            v ~ N(0, r)
type kalman struct {
	ql, qt, r float64
	x         *mat.VecDense // state estimate
	p         *mat.Dense    // its covariance
	f, q      *mat.Dense
	n         int
}

func newKalman(ql, qt, r float64) *kalman {
	return &kalman{ql: ql, qt: qt, r: r,
		f: mat.NewDense(2, 2, []float64{1, 1, 0, 1}),
		q: mat.NewDense(2, 2, []float64{ql, 0, 0, qt})}
}

func (k *kalman) Observe(z float64) {
	if !finite(z) {
		return
	}
	if k.n == 0 {
		// The first observation fixes the level; the trend is unknown,
		// so its variance starts large.
		k.x = mat.NewVecDense(2, []float64{z, 0})
		k.p = mat.NewDense(2, 2, []float64{k.r, 0, 0, 1e3 * (k.r + k.qt)})
		k.n++
		return
	}
	// Predict: x = F x, P = F P Fᵀ + Q.
	var x mat.VecDense
	x.MulVec(k.f, k.x)
	var fp, p mat.Dense
	fp.Mul(k.f, k.p)
	p.Mul(&fp, k.f.T())
	p.Add(&p, k.q)
	// Update with H = [1, 0]: the innovation is z − level, its variance
	// S = P₀₀ + r, the gain K = P Hᵀ / S = P[:,0] / S.
	s := p.At(0, 0) + k.r
	k0, k1 := p.At(0, 0)/s, p.At(1, 0)/s
	y := z - x.AtVec(0)
	x.SetVec(0, x.AtVec(0)+k0*y)
	x.SetVec(1, x.AtVec(1)+k1*y)
	// P = (I − K H) P.
	ikh := mat.NewDense(2, 2, []float64{1 - k0, 0, -k1, 1})
	var np mat.Dense
	np.Mul(ikh, &p)
	// Kept symmetric against rounding.
	off := (np.At(0, 1) + np.At(1, 0)) / 2
	np.Set(0, 1, off)
	np.Set(1, 0, off)
	if !finite(x.AtVec(0)) || !finite(x.AtVec(1)) || !finite(np.At(0, 0)) || !finite(np.At(1, 1)) {
		// A series too large for the arithmetic: start again from z.
		k.n = 0
		k.Observe(z)
		return
	}
	k.x, k.p = &x, &np
	k.n++
}

func (k *kalman) Predict(h int) float64 {
	if k.n == 0 {
		return 0
	}
	return clean(k.x.AtVec(0) + float64(max(h, 1))*k.x.AtVec(1))
}

func (k *kalman) Name() string {
	return "kalman:" + fmtF(k.ql) + "," + fmtF(k.qt) + "," + fmtF(k.r)
}

// holtWinters is additive seasonal exponential smoothing with a season of
// period observations. Until it has seen two whole seasons it predicts as
// Holt does; then it initialises level, trend and seasons from those two
// and smooths on.
type holtWinters struct {
	period             int
	alpha, beta, gamma float64
	warm               holt      // predicts until two seasons are in
	first              []float64 // the first two seasons
	level, trend       float64
	season             []float64
	n                  int // observations
}

func (w *holtWinters) Observe(v float64) {
	if !finite(v) {
		return
	}
	w.n++
	if w.season == nil {
		w.warm.Observe(v)
		w.first = append(w.first, v)
		if len(w.first) == 2*w.period {
			w.initialise()
		}
		return
	}
	w.update(v, (w.n-1)%w.period)
}

func (w *holtWinters) initialise() {
	p := w.period
	m1, m2 := mean(w.first[:p]), mean(w.first[p:])
	w.trend = (m2 - m1) / float64(p)
	w.season = make([]float64, p)
	for i := range p {
		// The trend inside a season is taken out of its deviations.
		c := float64(i) - float64(p-1)/2
		w.season[i] = ((w.first[i] - m1 - c*w.trend) + (w.first[p+i] - m2 - c*w.trend)) / 2
	}
	// The level at the start, so that smoothing the two seasons over
	// again ends where they do.
	w.level = m1 - float64(p+1)/2*w.trend
	for i, v := range w.first {
		w.update(v, i%p)
	}
	w.first = nil
}

func (w *holtWinters) update(v float64, i int) {
	prev := w.level
	w.level = w.alpha*(v-w.season[i]) + (1-w.alpha)*(w.level+w.trend)
	w.trend = w.beta*(w.level-prev) + (1-w.beta)*w.trend
	w.season[i] = w.gamma*(v-w.level) + (1-w.gamma)*w.season[i]
	if !finite(w.level) || !finite(w.trend) || !finite(w.season[i]) {
		// Start again from this value, as if it were the first.
		*w = holtWinters{period: w.period, alpha: w.alpha, beta: w.beta, gamma: w.gamma, warm: holt{alpha: w.alpha, beta: w.beta}}
		w.Observe(v)
	}
}

func (w *holtWinters) Predict(h int) float64 {
	if w.season == nil {
		return w.warm.Predict(h)
	}
	h = max(h, 1)
	return clean(w.level + float64(h)*w.trend + w.season[(w.n-1+h)%w.period])
}

func (w *holtWinters) Name() string {
	return "holt-winters:period=" + fmtF(float64(w.period)) + "," + fmtF(w.alpha) + "," + fmtF(w.beta) + "," + fmtF(w.gamma)
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

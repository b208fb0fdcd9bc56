package profiler

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// ErrFit marks a sweep the curves cannot be fitted to.
var ErrFit = errors.New("profiler: cannot fit")

// Check is one long prompt's measured time to first token against the
// fitted profile's (perf.PrefillTime: the prompt prefilled in chunks of
// max_num_batched_tokens).
type Check struct {
	ISL         int
	MeasuredMs  float64
	PredictedMs float64
}

// Err is the prediction's error relative to the measurement: 0.05 is 5 %.
func (c Check) Err() float64 { return (c.PredictedMs - c.MeasuredMs) / c.MeasuredMs }

// Fit fits a version-2 profile to a sweep measured on a worker with
// limits lim (lim.KVTokens and lim.MaxNumBatchedTokens are required):
//
//   - prefill: the step time against new tokens is the table of the
//     prefill points with isl ≤ max_num_batched_tokens (one prompt that
//     long is one step); at least two are needed.
//   - decode: D = a + b·p + c·p² + e·batch by least squares over the
//     decode points, p = concurrency·context / kv_tokens and batch =
//     concurrency; a term the sweep cannot tell apart from the others
//     (one context only: p is proportional to batch) or that comes out
//     negative (e) is left out and the rest fitted again.
//
// The longer prompts' points are checked against the fitted profile and
// returned as checks. The profile carries lim and the sweep.
func Fit(sw sim.Sweep, lim sim.WorkerLimits, source string) (sim.Profile, []Check, error) {
	if lim.KVTokens < 1 || lim.MaxNumBatchedTokens < 1 {
		return sim.Profile{}, nil, fmt.Errorf("%w: the worker's KV tokens (%d) and max batched tokens (%d) must be known", ErrFit, lim.KVTokens, lim.MaxNumBatchedTokens)
	}
	pre := slices.Clone(sw.Prefill)
	slices.SortStableFunc(pre, func(a, b sim.PrefillPoint) int { return cmp.Compare(a.ISL, b.ISL) })
	var pts [][2]float64
	var n []int // points averaged into each of pts
	var long []sim.PrefillPoint
	for _, pt := range pre {
		switch {
		case pt.ISL > lim.MaxNumBatchedTokens:
			long = append(long, pt)
		case len(pts) > 0 && pts[len(pts)-1][0] == float64(pt.ISL):
			// The same length again: keep the mean.
			i := len(pts) - 1
			pts[i][1] = (pts[i][1]*float64(n[i]) + pt.TTFTMs) / float64(n[i]+1)
			n[i]++
		default:
			pts = append(pts, [2]float64{float64(pt.ISL), pt.TTFTMs})
			n = append(n, 1)
		}
	}
	if len(pts) < 2 {
		return sim.Profile{}, nil, fmt.Errorf("%w: %d prefill input lengths ≤ max_num_batched_tokens (%d) measured, need at least 2", ErrFit, len(pts), lim.MaxNumBatchedTokens)
	}
	dec, err := fitDecode(sw.Decode, float64(lim.KVTokens))
	if err != nil {
		return sim.Profile{}, nil, err
	}
	w := lim
	p := sim.Profile{Version: 2, Source: source, Prefill: sim.Curve{Points: pts}, Decode: dec, Worker: &w, Sweep: &sw}
	if err := p.Validate(); err != nil {
		return sim.Profile{}, nil, fmt.Errorf("%w: %w", ErrFit, err)
	}
	m, err := perf.FromProfile(p)
	if err != nil {
		return sim.Profile{}, nil, fmt.Errorf("%w: %w", ErrFit, err)
	}
	var checks []Check
	for _, pt := range long {
		checks = append(checks, Check{ISL: pt.ISL, MeasuredMs: pt.TTFTMs, PredictedMs: msOf(m.PrefillTime(float64(pt.ISL)))})
	}
	return p, checks, nil
}

// fitDecode fits D = a + b·p + c·p² + e·batch to the points.
func fitDecode(pts []sim.DecodePoint, kv float64) (sim.Curve, error) {
	if len(pts) == 0 {
		return sim.Curve{}, fmt.Errorf("%w: no decode points measured", ErrFit)
	}
	rows := make([][4]float64, len(pts))
	ys := make([]float64, len(pts))
	minITL := math.Inf(1)
	for i, pt := range pts {
		p := float64(pt.Concurrency) * float64(pt.Context) / kv
		rows[i] = [4]float64{1, p, p * p, float64(pt.Concurrency)}
		ys[i] = pt.ITLMs
		minITL = min(minITL, pt.ITLMs)
	}
	// The terms in the order they are given up: the batch term first,
	// then the curvature, then the slope.
	for _, terms := range [][]int{{0, 1, 2, 3}, {0, 1, 2}, {0, 1}, {0}} {
		if len(terms) > len(pts) {
			continue
		}
		coef, ok := leastSquares(rows, ys, terms)
		if !ok {
			continue
		}
		var full [4]float64
		for j, t := range terms {
			full[t] = coef[j]
		}
		if full[3] < 0 {
			continue // a negative cost per sequence is noise: fit without it
		}
		return sim.Curve{Poly: trimZeros(full[:3]), PerSeqMs: full[3], MinMs: minITL / 2}, nil
	}
	return sim.Curve{}, fmt.Errorf("%w: the decode points fit no curve", ErrFit)
}

// trimZeros drops the polynomial's zero high-order coefficients, keeping c0.
func trimZeros(c []float64) []float64 {
	n := len(c)
	for n > 1 && c[n-1] == 0 {
		n--
	}
	return slices.Clone(c[:n])
}

// leastSquares solves the normal equations (XᵀX)β = Xᵀy over the columns
// terms of rows by Gaussian elimination with partial pivoting. ok is
// false when XᵀX is singular: the columns are not independent.
func leastSquares(rows [][4]float64, ys []float64, terms []int) ([]float64, bool) {
	n := len(terms)
	a := make([][]float64, n)
	for i := range a {
		a[i] = make([]float64, n+1)
	}
	for r, row := range rows {
		for i, ti := range terms {
			for j, tj := range terms {
				a[i][j] += row[ti] * row[tj]
			}
			a[i][n] += row[ti] * ys[r]
		}
	}
	// The scale of the matrix, for a relative test of singularity.
	var scale float64
	for i := range n {
		scale = max(scale, math.Abs(a[i][i]))
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if math.Abs(a[piv][col]) <= 1e-10*scale {
			return nil, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := range n {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for c := col; c <= n; c++ {
				a[r][c] -= f * a[col][c]
			}
		}
	}
	beta := make([]float64, n)
	for i := range n {
		beta[i] = a[i][n] / a[i][i]
		if math.IsNaN(beta[i]) || math.IsInf(beta[i], 0) {
			return nil, false
		}
	}
	return beta, true
}

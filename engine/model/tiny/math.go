package tiny

import (
	"math"
	"sync"
)

// The kernels below are the model's whole arithmetic. Each computes one
// row's outputs from that row's inputs alone, accumulating in a fixed
// order, so a token's values are the same bits however many tokens or
// sequences share its step and whichever goroutine computes them. Work is
// spread over goroutines by rows only; no reduction is ever split.

// dot is Σ a[i]·b[i] over len(a) elements, accumulated in four float32
// lanes (i mod 4) added as (l0+l1)+(l2+l3), then the tail in order.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	s := (s0 + s1) + (s2 + s3)
	for ; i < len(a); i++ {
		s += a[i] * b[i]
	}
	return s
}

// matVec sets y[r] = dot(W row r, x) for each of len(y) rows of W, each
// row len(x) wide.
func matVec(y, w, x []float32) {
	n := len(x)
	for r := range y {
		y[r] = dot(w[r*n:(r+1)*n], x)
	}
}

// rmsNorm sets y = x / √(mean(x²) + eps) ⊙ g; the mean is summed in
// float64, in order.
func rmsNorm(y, x, g []float32, eps float64) {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := float32(1 / math.Sqrt(ss/float64(len(x))+eps))
	for i, v := range x {
		y[i] = v * inv * g[i]
	}
}

// ropeTable holds cos and sin of the rotary angles: for position p and
// pair i of a head, θ = p · theta^(−2i/headDim), at [p·headDim/2 + i].
type ropeTable struct {
	half     int
	cos, sin []float32
}

func newRope(positions, headDim int, theta float64) ropeTable {
	half := headDim / 2
	t := ropeTable{half: half, cos: make([]float32, positions*half), sin: make([]float32, positions*half)}
	for p := range positions {
		for i := range half {
			a := float64(p) * math.Pow(theta, -2*float64(i)/float64(headDim))
			t.cos[p*half+i], t.sin[p*half+i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	return t
}

// rotate applies position p's rotation to each head of x (heads of
// headDim = 2·half, one after another), pairing element i with i+half (the
// "rotate half" layout): (a, b) → (a·cos − b·sin, a·sin + b·cos).
func (t ropeTable) rotate(x []float32, p int) {
	c, s := t.cos[p*t.half:(p+1)*t.half], t.sin[p*t.half:(p+1)*t.half]
	for h := 0; h < len(x); h += 2 * t.half {
		head := x[h : h+2*t.half]
		for i := range t.half {
			a, b := head[i], head[i+t.half]
			head[i] = a*c[i] - b*s[i]
			head[i+t.half] = a*s[i] + b*c[i]
		}
	}
}

// silu is x·σ(x).
func silu(x float32) float32 { return x / (1 + float32(math.Exp(-float64(x)))) }

// parallel calls f(lo, hi) over [0, n) cut into at most workers ranges,
// concurrently, and waits for them.
func parallel(n, workers int, f func(lo, hi int)) {
	if workers <= 1 || n <= 1 {
		f(0, n)
		return
	}
	workers = min(workers, n)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Go(func() { f(lo, hi) })
	}
	wg.Wait()
}

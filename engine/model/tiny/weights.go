package tiny

import "math"

// weights are the model's parameters, float32, row-major: a matrix of
// shape out×in is out rows of in, and y = W·x is y[r] = Σ_c W[r·in+c]·x[c].
type weights struct {
	embed  []float32 // Vocab×Dim; also the output projection (tied)
	layers []layerWeights
	norm   []float32 // Dim, the final RMSNorm's gain
}

type layerWeights struct {
	attnNorm []float32 // Dim
	wq       []float32 // Heads·HeadDim × Dim
	wk, wv   []float32 // KVHeads·HeadDim × Dim
	wo       []float32 // Dim × Heads·HeadDim
	mlpNorm  []float32 // Dim
	wg, wu   []float32 // Hidden × Dim (gate, up)
	wd       []float32 // Dim × Hidden (down)
}

// seededWeights generates the weights from c.Seed, deterministically:
// one splitmix64 stream (as engine/model/sim uses) starting at the seed
// fills, in this order, the embedding, then per layer wq, wk, wv, wo, wg,
// wu, wd. Each element is uniform in [−a, a) from the top 24 bits of one
// output: a = √3/√Dim for the embedding (variance 1/Dim, so tied logits of
// a unit-RMS state have variance ≈ 1), a = √3/√fan_in for a projection
// (variance 1/fan_in, so a unit-RMS input gives a unit-RMS output), and
// wo, wd further scaled by 1/√(2·Layers) so that the residual stream grows
// slowly with depth. Norm gains are 1.
func seededWeights(c Config) *weights {
	state := c.Seed
	fill := func(n, fanIn int, scale float64) []float32 {
		a := float32(math.Sqrt(3/float64(fanIn)) * scale)
		w := make([]float32, n)
		for i := range w {
			u := float32(splitmix(&state)>>40) / (1 << 24) // [0, 1)
			w[i] = (2*u - 1) * a
		}
		return w
	}
	ones := func(n int) []float32 {
		w := make([]float32, n)
		for i := range w {
			w[i] = 1
		}
		return w
	}
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	res := 1 / math.Sqrt(2*float64(c.Layers))
	w := &weights{embed: fill(c.Vocab*c.Dim, c.Dim, 1), norm: ones(c.Dim)}
	for range c.Layers {
		w.layers = append(w.layers, layerWeights{
			attnNorm: ones(c.Dim),
			wq:       fill(q*c.Dim, c.Dim, 1),
			wk:       fill(kv*c.Dim, c.Dim, 1),
			wv:       fill(kv*c.Dim, c.Dim, 1),
			wo:       fill(c.Dim*q, q, res),
			mlpNorm:  ones(c.Dim),
			wg:       fill(c.Hidden*c.Dim, c.Dim, 1),
			wu:       fill(c.Hidden*c.Dim, c.Dim, 1),
			wd:       fill(c.Dim*c.Hidden, c.Hidden, res),
		})
	}
	return w
}

func splitmix(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

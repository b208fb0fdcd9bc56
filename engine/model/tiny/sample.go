package tiny

import (
	"math"
	"math/rand/v2"

	"github.com/kvstrata/kvstrata/engine/model"
)

// sample chooses s's next token from its logits, as model.Seq says:
//
//   - Temperature 0: greedy, the highest logit, the lowest id on a tie.
//   - Temperature T > 0: u uniform in [0, 1) from a PCG generator seeded
//     (Seed, len(Tokens)); w_i = exp((logit_i − max)/T) in float64; the
//     token is the first i with w_0 + … + w_i > u · Σw, summed in id order.
//
// Both are functions of the logits and s's settings alone.
func sample(logits []float32, s model.Seq) uint32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if s.Temperature == 0 {
		return uint32(best)
	}
	mx, t := float64(logits[best]), s.Temperature
	var total float64
	for _, v := range logits {
		total += math.Exp((float64(v) - mx) / t)
	}
	target := rand.New(rand.NewPCG(s.Seed, uint64(len(s.Tokens)))).Float64() * total
	var cum float64
	for i, v := range logits {
		cum += math.Exp((float64(v) - mx) / t)
		if cum > target {
			return uint32(i)
		}
	}
	return uint32(best) // only if rounding left target ≥ the last sum
}

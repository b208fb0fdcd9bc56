package tiny

import (
	"math/rand/v2"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model"
)

// checkRestoreEqualsRecompute draws from seed a prompt, a split point, a
// chunking of the rest and a companion sequence, and checks that prefilling
// the rest behind the restored prefix, chunk by chunk and batched with the
// companion, gives the logits, next token and blocks of a full recompute.
func checkRestoreEqualsRecompute(t *testing.T, m *Model, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	n := 2 + r.IntN(40)
	toks := prompt(n, seed)
	temp := []float64{0, 0.7, 1.3}[r.IntN(3)]
	full, want := run(t, m, model.Seq{Tokens: toks, Temperature: temp, Seed: seed})

	c := r.IntN(n)
	have := prefixAt(t, m, toks, c)
	companion := model.Seq{Tokens: prompt(1+r.IntN(20), seed+1)}
	var res model.Result
	var logits [][]float32
	bt := m.cfg.BlockTokens
	for c < n {
		end := min(n, c+1+r.IntN(12))
		s := model.Seq{Tokens: toks[:end], Cached: c, Prefix: stored(have), Temperature: temp, Seed: seed}
		if r.IntN(2) == 0 {
			res, logits = run(t, m, s, companion)
		} else {
			res, logits = run(t, m, companion, s)
			res.Next[0], res.Blocks[0], logits[0] = res.Next[1], res.Blocks[1], logits[1]
		}
		have = append(have[:c/bt], res.Blocks[0]...)
		c = end
	}
	if !sameBits(logits[0], want[0]) || res.Next[0] != full.Next[0] || !blocksEqual(have, full.Blocks[0]) {
		t.Fatalf("seed %d: %d tokens restored and chunked differ from a full recompute", seed, n)
	}
}

func TestRestoreEqualsRecomputeOverRandomSplits(t *testing.T) {
	m := newModel(t, small())
	for seed := range uint64(40) {
		checkRestoreEqualsRecompute(t, m, seed)
	}
}

func FuzzRestoreEqualsRecompute(f *testing.F) {
	m := newModel(f, small())
	for _, s := range []uint64{0, 1, 2, 1 << 40} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) { checkRestoreEqualsRecompute(t, m, seed) })
}

package policy

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// Whatever the inputs, Choose picks a healthy candidate that is not busy,
// or says why it cannot; a refused request leaves no load behind.
func FuzzChoose(f *testing.F) {
	f.Add(uint64(1), uint8(4), uint16(300), uint8(0), uint8(0))
	f.Add(uint64(2), uint8(64), uint16(5000), uint8(3), uint8(1))
	f.Add(uint64(3), uint8(1), uint16(0), uint8(4), uint8(2))
	f.Fuzz(func(t *testing.T, seed uint64, nw uint8, tokens uint16, pol uint8, temp uint8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		r := newRouter(t, Config{Seed: seed, BusyPrefillTokens: 2000, Temperature: float64(temp%4) / 2, TieBreak: TieBreak(seed % 2)})
		p := Policy(pol % uint8(len(policyNames)))
		req := Request{Tokens: int(tokens), Override: &Override{Policy: &p}}
		req.Blocks = req.Tokens / 16
		if req.Blocks > 0 {
			req.Blocks -= rng.IntN(2) // sometimes a block short
		}
		cands := make([]Candidate, int(nw)%70)
		for i := range cands {
			c := &cands[i]
			c.Worker = string(rune('A' + i))
			left := req.Blocks
			if left > 0 {
				c.Overlap = rng.IntN(left + 1)
				left -= c.Overlap
			}
			for k := range c.Tiers {
				if left > 0 && rng.IntN(2) == 0 {
					c.Tiers[k] = rng.IntN(left + 1)
					left -= c.Tiers[k]
				}
			}
			c.Capacity = rng.IntN(200)
			c.Unhealthy = rng.IntN(4) == 0
			c.Load = Load{PrefillTokens: float64(rng.IntN(3000)), Blocks: rng.IntN(250)}
		}
		var seqs []*Sequence
		for range 3 { // a burst: each decision sees the previous ones
			d, err := r.Choose(req, cands)
			if err != nil {
				if !errors.Is(err, ErrAllBusy) && !errors.Is(err, ErrNoWorkers) {
					t.Fatalf("Choose: %v", err)
				}
				anyHealthy := false
				for _, c := range cands {
					anyHealthy = anyHealthy || !c.Unhealthy
				}
				if errors.Is(err, ErrAllBusy) != anyHealthy {
					t.Fatalf("Choose: %v with a healthy candidate: %v", err, anyHealthy)
				}
				break
			}
			if d.Index < 0 || d.Index >= len(cands) || cands[d.Index].Worker != d.Worker {
				t.Fatalf("decision %+v outside the %d candidates", d, len(cands))
			}
			c := &cands[d.Index]
			if c.Unhealthy {
				t.Fatalf("chose unhealthy %s", c.Worker)
			}
			if d.NewTokens < -1e-9 || d.NewTokens > float64(req.Tokens)+1e-9 {
				t.Fatalf("new tokens %v for a prompt of %d", d.NewTokens, req.Tokens)
			}
			// Not busy before this decision: its load then was the load now
			// less what this decision added.
			l := r.Load(c.Worker)
			l.PrefillTokens += c.Load.PrefillTokens - d.NewTokens
			l.Blocks += c.Load.Blocks - (ceilDiv(req.Tokens, 16) - c.Overlap)
			if (c.Capacity > 0 && float64(l.Blocks) >= 0.95*float64(c.Capacity)) || l.PrefillTokens >= 2000-1e-6 {
				t.Fatalf("chose busy %s: load %+v, capacity %d", c.Worker, l, c.Capacity)
			}
			seqs = append(seqs, d.Seq)
		}
		for _, s := range seqs {
			s.Done()
		}
		if len(r.loads) != 0 {
			t.Fatalf("%d workers still loaded after every sequence ended", len(r.loads))
		}
	})
}

package tiny

import (
	"context"
	"fmt"
	"math"

	"github.com/kvstrata/kvstrata/engine/model"
)

// The forward pass of one step, for the batch's new tokens (rows). Per
// layer l, with x a row's residual stream (Dim) at position p:
//
//	h = RMSNorm(x)·g_attn
//	q = RoPE_p(Wq·h), k = RoPE_p(Wk·h), v = Wv·h   (k, v stored at p)
//	for query head j, KV head g = j / (Heads/KVHeads):
//	  s_t = q_j·k_{g,t} / √HeadDim  for t = 0 … p   (causal)
//	  o_j = Σ_t softmax(s)_t · v_{g,t}
//	x += Wo·o
//	h = RMSNorm(x)·g_mlp
//	x += Wd·(SiLU(Wg·h) ⊙ (Wu·h))
//
// and after the last layer a sequence's last row gives its logits,
// E·(RMSNorm(x)·g_final), E the embedding (tied output projection). x
// starts as the token's embedding row.
//
// A row's values depend only on its token, its position and the K/V of
// positions ≤ p of its own sequence, each computed by the same kernels in
// the same order: so a position's K/V are the same bits whether computed
// now, in an earlier chunk, on another worker or read back from kvstrata,
// and a row's logits do not depend on the batch around it.

// seqKV is one sequence's K and V during a step: per layer, len(Tokens)
// rows of KVHeads·HeadDim, positions < Cached read from its Prefix.
type seqKV struct {
	k, v [][]float32
}

// row is one new token of the batch: sequence, position.
type row struct{ seq, pos int }

// forward runs the batch's new tokens through the model and returns each
// sequence's logits after its last token, and its K/V.
func (m *Model) forward(ctx context.Context, batch []model.Seq) ([][]float32, []seqKV, error) {
	c := m.cfg
	kvDim := c.KVHeads * c.HeadDim
	kvs := make([]seqKV, len(batch))
	var rows []row
	for i, s := range batch {
		n := len(s.Tokens)
		kv := seqKV{k: make([][]float32, c.Layers), v: make([][]float32, c.Layers)}
		for l := range c.Layers {
			kv.k[l], kv.v[l] = make([]float32, n*kvDim), make([]float32, n*kvDim)
		}
		m.readPrefix(kv, s)
		kvs[i] = kv
		for p := s.Cached; p < n; p++ {
			rows = append(rows, row{i, p})
		}
	}
	x := make([]float32, len(rows)*c.Dim)
	for r, rw := range rows {
		t := int(batch[rw.seq].Tokens[rw.pos])
		copy(x[r*c.Dim:(r+1)*c.Dim], m.w.embed[t*c.Dim:(t+1)*c.Dim])
	}
	q := make([]float32, len(rows)*c.Heads*c.HeadDim)
	for l := range c.Layers {
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("tiny: step interrupted: %w", err)
		}
		m.qkv(l, rows, x, q, kvs)
		m.attendAndMLP(l, rows, x, q, kvs)
	}
	// Each sequence's last row is its last token's.
	logits := make([][]float32, len(batch))
	h := make([]float32, c.Dim)
	r := 0
	for i, s := range batch {
		r += len(s.Tokens) - s.Cached
		rmsNorm(h, x[(r-1)*c.Dim:r*c.Dim], m.w.norm, c.NormEps)
		logits[i] = make([]float32, c.Vocab)
		parallel(c.Vocab, c.Workers, func(lo, hi int) {
			matVec(logits[i][lo:hi], m.w.embed[lo*c.Dim:hi*c.Dim], h)
		})
	}
	return logits, kvs, nil
}

// qkv computes layer l's query of each row into q and its key and value
// into its sequence's K/V at its position.
func (m *Model) qkv(l int, rows []row, x, q []float32, kvs []seqKV) {
	c, lw := m.cfg, &m.w.layers[l]
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	parallel(len(rows), c.Workers, func(lo, hi int) {
		h := make([]float32, c.Dim)
		for r := lo; r < hi; r++ {
			p := rows[r].pos
			rmsNorm(h, x[r*c.Dim:(r+1)*c.Dim], lw.attnNorm, c.NormEps)
			qr := q[r*qDim : (r+1)*qDim]
			matVec(qr, lw.wq, h)
			m.rope.rotate(qr, p)
			kv := kvs[rows[r].seq]
			k, v := kv.k[l][p*kvDim:(p+1)*kvDim], kv.v[l][p*kvDim:(p+1)*kvDim]
			matVec(k, lw.wk, h)
			m.rope.rotate(k, p)
			matVec(v, lw.wv, h)
		}
	})
}

// attendAndMLP adds layer l's attention and MLP outputs to each row's
// residual stream; every row's K/V of layer l must be computed.
func (m *Model) attendAndMLP(l int, rows []row, x, q []float32, kvs []seqKV) {
	c, lw := m.cfg, &m.w.layers[l]
	qDim, kvDim, group := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Heads/c.KVHeads
	scale := float32(1 / math.Sqrt(float64(c.HeadDim)))
	parallel(len(rows), c.Workers, func(lo, hi int) {
		o, d := make([]float32, qDim), make([]float32, c.Dim)
		h, g, u := make([]float32, c.Dim), make([]float32, c.Hidden), make([]float32, c.Hidden)
		var s []float32
		var e []float64
		for r := lo; r < hi; r++ {
			p, kv := rows[r].pos, kvs[rows[r].seq]
			s, e = s[:0], e[:0]
			for j := range c.Heads {
				qj := q[r*qDim+j*c.HeadDim : r*qDim+(j+1)*c.HeadDim]
				off := (j / group) * c.HeadDim
				s = s[:0]
				mx := float32(math.Inf(-1))
				for t := 0; t <= p; t++ {
					v := dot(qj, kv.k[l][t*kvDim+off:t*kvDim+off+c.HeadDim]) * scale
					s = append(s, v)
					mx = max(mx, v)
				}
				e = e[:0]
				var sum float64
				for _, v := range s {
					ev := math.Exp(float64(v - mx))
					e = append(e, ev)
					sum += ev
				}
				oj := o[j*c.HeadDim : (j+1)*c.HeadDim]
				clear(oj)
				for t, ev := range e {
					w := float32(ev / sum)
					vt := kv.v[l][t*kvDim+off : t*kvDim+off+c.HeadDim]
					for i := range oj {
						oj[i] += w * vt[i]
					}
				}
			}
			xr := x[r*c.Dim : (r+1)*c.Dim]
			matVec(d, lw.wo, o)
			for i := range xr {
				xr[i] += d[i]
			}
			rmsNorm(h, xr, lw.mlpNorm, c.NormEps)
			matVec(g, lw.wg, h)
			matVec(u, lw.wu, h)
			for i := range g {
				g[i] = silu(g[i]) * u[i]
			}
			matVec(d, lw.wd, g)
			for i := range xr {
				xr[i] += d[i]
			}
		}
	})
}

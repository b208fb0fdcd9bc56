package tiny

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kvstrata/kvstrata/engine/model"
)

// A block's KV bytes are model.go's layout with dtype "fp32": per layer,
//
//	K[token][kv_head][head_dim] ‖ V[token][kv_head][head_dim]
//
// BlockTokens rows each, every element a float32's IEEE-754 bits,
// little-endian; K is after RoPE (as attention reads it). Rows past a
// partial block's Tokens are zero.

// checkPrefix reports a Prefix that does not hold the KV of s's Cached
// tokens in the model's layout, wrapping model.ErrBadBatch.
func (m *Model) checkPrefix(i int, s model.Seq) error {
	bt, lb := m.cfg.BlockTokens, m.layout.LayerBytes()
	want := (s.Cached + bt - 1) / bt
	if len(s.Prefix) != want {
		return fmt.Errorf("%w: sequence %d: %d cached tokens need %d prefix blocks, has %d", model.ErrBadBatch, i, s.Cached, want, len(s.Prefix))
	}
	for j, b := range s.Prefix {
		rows := min(bt, s.Cached-j*bt)
		switch {
		case b.Index != j:
			return fmt.Errorf("%w: sequence %d: prefix block %d has index %d", model.ErrBadBatch, i, j, b.Index)
		case b.Tokens < rows || b.Tokens > bt:
			return fmt.Errorf("%w: sequence %d: prefix block %d holds %d tokens, need %d to %d", model.ErrBadBatch, i, j, b.Tokens, rows, bt)
		case len(b.Layers) != m.cfg.Layers:
			return fmt.Errorf("%w: sequence %d: prefix block %d has %d layers, want %d", model.ErrBadBatch, i, j, len(b.Layers), m.cfg.Layers)
		}
		for l, lay := range b.Layers {
			if len(lay) != lb {
				return fmt.Errorf("%w: sequence %d: prefix block %d layer %d is %d bytes, want %d", model.ErrBadBatch, i, j, l, len(lay), lb)
			}
		}
	}
	return nil
}

// readPrefix decodes the K/V of s's cached positions from its Prefix,
// which checkPrefix accepted, into kv.
func (m *Model) readPrefix(kv seqKV, s model.Seq) {
	bt, kvDim := m.cfg.BlockTokens, m.cfg.KVHeads*m.cfg.HeadDim
	half := bt * kvDim * 4 // bytes of K, then as many of V
	for j, b := range s.Prefix {
		rows := min(bt, s.Cached-j*bt)
		for l, lay := range b.Layers {
			p := j * bt * kvDim
			getF32(kv.k[l][p:p+rows*kvDim], lay[:rows*kvDim*4])
			getF32(kv.v[l][p:p+rows*kvDim], lay[half:half+rows*kvDim*4])
		}
	}
}

// blocks returns the blocks of s from the one holding token s.Cached to
// the last, filled from kv, with the chained hashes of the full ones.
func (m *Model) blocks(s model.Seq, kv seqKV) []model.Block {
	bt, kvDim, lb := m.cfg.BlockTokens, m.cfg.KVHeads*m.cfg.HeadDim, m.layout.LayerBytes()
	half := bt * kvDim * 4
	hashes := m.layout.Namespace.Hashes(s.Tokens)
	n := len(s.Tokens)
	var out []model.Block
	for j := s.Cached / bt; j*bt < n; j++ {
		rows := min(bt, n-j*bt)
		b := model.Block{Index: j, Tokens: rows, Layers: make([][]byte, m.cfg.Layers)}
		if j < len(hashes) {
			b.Hash = hashes[j]
		}
		buf := make([]byte, lb*m.cfg.Layers)
		p := j * bt * kvDim
		for l := range b.Layers {
			lay := buf[l*lb : (l+1)*lb : (l+1)*lb]
			putF32(lay, kv.k[l][p:p+rows*kvDim])
			putF32(lay[half:], kv.v[l][p:p+rows*kvDim])
			b.Layers[l] = lay
		}
		out = append(out, b)
	}
	return out
}

func getF32(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func putF32(dst []byte, src []float32) {
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

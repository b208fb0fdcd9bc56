package tiny

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
)

// Weights can also come from a safetensors file (Config.Weights): an
// 8-byte little-endian header length N, N bytes of JSON header mapping
// each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets into the data after the header; "__metadata__" is ignored),
// then the tensors' raw little-endian bytes. This reader takes dtype "F32"
// only, and exactly these tensors, named as Llama-architecture checkpoints
// name them, of the shapes Config gives (out × in, row-major):
//
//	model.embed_tokens.weight                    Vocab × Dim (tied output)
//	model.layers.L.input_layernorm.weight        Dim
//	model.layers.L.self_attn.q_proj.weight       Heads·HeadDim × Dim
//	model.layers.L.self_attn.k_proj.weight       KVHeads·HeadDim × Dim
//	model.layers.L.self_attn.v_proj.weight       KVHeads·HeadDim × Dim
//	model.layers.L.self_attn.o_proj.weight       Dim × Heads·HeadDim
//	model.layers.L.post_attention_layernorm.weight  Dim
//	model.layers.L.mlp.gate_proj.weight          Hidden × Dim
//	model.layers.L.mlp.up_proj.weight            Hidden × Dim
//	model.layers.L.mlp.down_proj.weight          Dim × Hidden
//	model.norm.weight                            Dim
//
// for L = 0 … Layers−1. RoPE pairs element i of a head with i + HeadDim/2
// (Llama's "rotate half"). A missing, extra (lm_head.weight included: the
// output projection is tied), misshapen or overlapping tensor is an error.

// ErrBadWeights marks a weights file that cannot be read or does not fit
// the config.
var ErrBadWeights = errors.New("tiny: bad weights file")

// maxHeader bounds the JSON header a reader accepts.
const maxHeader = 64 << 20

type tensorInfo struct {
	DType   string   `json:"dtype"`
	Shape   []int    `json:"shape"`
	Offsets [2]int64 `json:"data_offsets"`
}

// tensor is one named tensor of the model's weights and its shape.
type tensor struct {
	name  string
	shape []int
	data  *[]float32
}

// tensors lists w's tensors under their safetensors names, in file order.
func (w *weights) tensors(c Config) []tensor {
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	ts := []tensor{{"model.embed_tokens.weight", []int{c.Vocab, c.Dim}, &w.embed}}
	if len(w.layers) < c.Layers {
		w.layers = make([]layerWeights, c.Layers)
	}
	for l := range c.Layers {
		lw, p := &w.layers[l], fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			tensor{p + "input_layernorm.weight", []int{c.Dim}, &lw.attnNorm},
			tensor{p + "self_attn.q_proj.weight", []int{q, c.Dim}, &lw.wq},
			tensor{p + "self_attn.k_proj.weight", []int{kv, c.Dim}, &lw.wk},
			tensor{p + "self_attn.v_proj.weight", []int{kv, c.Dim}, &lw.wv},
			tensor{p + "self_attn.o_proj.weight", []int{c.Dim, q}, &lw.wo},
			tensor{p + "post_attention_layernorm.weight", []int{c.Dim}, &lw.mlpNorm},
			tensor{p + "mlp.gate_proj.weight", []int{c.Hidden, c.Dim}, &lw.wg},
			tensor{p + "mlp.up_proj.weight", []int{c.Hidden, c.Dim}, &lw.wu},
			tensor{p + "mlp.down_proj.weight", []int{c.Dim, c.Hidden}, &lw.wd},
		)
	}
	return append(ts, tensor{"model.norm.weight", []int{c.Dim}, &w.norm})
}

// readSafetensors reads the weights of c from the safetensors file at path.
func readSafetensors(path string, c Config) (*weights, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadWeights, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadWeights, err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrBadWeights, path, fmt.Sprintf(format, args...))
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, bad("no header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader || int64(n) > st.Size()-8 {
		return nil, bad("header length %d does not fit the file of %d bytes", n, st.Size())
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, bad("header: %v", err)
	}
	var infos map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &infos); err != nil {
		return nil, bad("header: %v", err)
	}
	delete(infos, "__metadata__")
	dataLen := st.Size() - 8 - int64(n)
	w := &weights{}
	var spans [][2]int64
	for _, t := range w.tensors(c) {
		raw, ok := infos[t.name]
		if !ok {
			return nil, bad("tensor %s is missing", t.name)
		}
		delete(infos, t.name)
		var ti tensorInfo
		if err := json.Unmarshal(raw, &ti); err != nil {
			return nil, bad("tensor %s: %v", t.name, err)
		}
		elems := 1
		for _, d := range t.shape {
			elems *= d
		}
		switch {
		case ti.DType != "F32":
			return nil, bad("tensor %s is %s, this reader takes F32", t.name, ti.DType)
		case !slices.Equal(ti.Shape, t.shape):
			return nil, bad("tensor %s has shape %v, the config needs %v", t.name, ti.Shape, t.shape)
		case ti.Offsets[0] < 0 || ti.Offsets[1] > dataLen || ti.Offsets[1]-ti.Offsets[0] != 4*int64(elems):
			return nil, bad("tensor %s spans bytes %v of %d, needs %d bytes", t.name, ti.Offsets, dataLen, 4*elems)
		}
		spans = append(spans, ti.Offsets)
		buf := make([]byte, 4*elems)
		if _, err := f.ReadAt(buf, 8+int64(n)+ti.Offsets[0]); err != nil {
			return nil, bad("tensor %s: %v", t.name, err)
		}
		*t.data = make([]float32, elems)
		getF32(*t.data, buf)
	}
	if len(infos) > 0 {
		extra := make([]string, 0, len(infos))
		for k := range infos {
			extra = append(extra, k)
		}
		slices.Sort(extra)
		return nil, bad("tensors this model does not have: %s", strings.Join(extra, ", "))
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	for i := 1; i < len(spans); i++ {
		if spans[i][0] < spans[i-1][1] {
			return nil, bad("tensors overlap at byte %d", spans[i][0])
		}
	}
	for _, t := range w.tensors(c) {
		for _, v := range *t.data {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, bad("tensor %s holds %v", t.name, v)
			}
		}
	}
	return w, nil
}

// WriteSafetensors writes the model's weights to w in the safetensors form
// readSafetensors (Config.Weights) reads, tensors in the documented order.
func (m *Model) WriteSafetensors(w io.Writer) error {
	ts := m.w.tensors(m.cfg)
	hdr := make(map[string]tensorInfo, len(ts))
	var off int64
	for _, t := range ts {
		size := 4 * int64(len(*t.data))
		hdr[t.name] = tensorInfo{DType: "F32", Shape: t.shape, Offsets: [2]int64{off, off + size}}
		off += size
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(js)))
	if _, err := w.Write(append(lenBuf[:], js...)); err != nil {
		return err
	}
	for _, t := range ts {
		buf := make([]byte, 4*len(*t.data))
		putF32(buf, *t.data)
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

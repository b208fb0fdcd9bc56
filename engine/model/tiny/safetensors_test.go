package tiny

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model"
)

// writeFile writes m's weights as a safetensors file and returns its path.
func writeFile(t *testing.T, m *Model) string {
	t.Helper()
	var buf bytes.Buffer
	if err := m.WriteSafetensors(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestWeightsFromASafetensorsFile(t *testing.T) {
	src := newModel(t, func() Config { c := small(); c.Seed = 5; return c }())
	cfg := small()
	cfg.Weights = writeFile(t, src)
	m := newModel(t, cfg) // seed 1, but weights read from seed 5's file
	toks := prompt(13, 20)
	want, wl := run(t, src, model.Seq{Tokens: toks})
	got, gl := run(t, m, model.Seq{Tokens: toks})
	if !sameBits(gl[0], wl[0]) || got.Next[0] != want.Next[0] || !blocksEqual(got.Blocks[0], want.Blocks[0]) {
		t.Error("a model reading another's weights file computes other logits or KV")
	}
}

// rewrite reads the safetensors file at path, lets f change its header,
// and writes it back with the same data.
func rewrite(t *testing.T, path string, f func(h map[string]any)) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var h map[string]any
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	f(h)
	js, _ := json.Marshal(h)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	out = append(append(out, js...), b[8+n:]...)
	p := filepath.Join(t.TempDir(), "changed.safetensors")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBadWeightsFilesAreRefused(t *testing.T) {
	good := writeFile(t, newModel(t, small()))
	raw, _ := os.ReadFile(good)
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "bad.safetensors")
		os.WriteFile(p, b, 0o644)
		return p
	}
	const wq = "model.layers.1.self_attn.q_proj.weight"
	field := func(name, key string, v any) func(h map[string]any) {
		return func(h map[string]any) { h[name].(map[string]any)[key] = v }
	}
	for what, tc := range map[string]struct {
		path, says string
	}{
		"no file":             {filepath.Join(t.TempDir(), "none"), "no such file"},
		"empty file":          {write(nil), "no header length"},
		"header past the end": {write(binary.LittleEndian.AppendUint64(nil, 1<<20)), "header length"},
		"header not JSON":     {write(append(binary.LittleEndian.AppendUint64(nil, 3), "{x}"...)), "header"},
		"truncated data":      {write(raw[:len(raw)-4]), "model.norm.weight spans"},
		"a tensor missing":    {rewrite(t, good, func(h map[string]any) { delete(h, wq) }), wq + " is missing"},
		"an extra tensor": {rewrite(t, good, func(h map[string]any) {
			h["lm_head.weight"] = h["model.embed_tokens.weight"]
		}), "lm_head.weight"},
		"another dtype":     {rewrite(t, good, field(wq, "dtype", "BF16")), "is BF16"},
		"another shape":     {rewrite(t, good, field(wq, "shape", []int{16, 64})), "shape [16 64]"},
		"overlapping":       {rewrite(t, good, field(wq, "data_offsets", []int64{0, 32 * 32 * 4})), "overlap"},
		"offsets reversed":  {rewrite(t, good, field(wq, "data_offsets", []int64{4096, 0})), "spans"},
		"not finite values": {write(nanAt(raw)), "holds NaN"},
	} {
		_, err := New(func() Config { c := small(); c.Weights = tc.path; return c }())
		if !errors.Is(err, ErrBadWeights) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: New returned %v, want ErrBadWeights saying %q", what, err, tc.says)
		}
	}
	other := small()
	other.Dim, other.Weights = 48, good
	if _, err := New(other); !errors.Is(err, ErrBadWeights) {
		t.Errorf("a file for another config: %v", err)
	}
}

// nanAt is the file raw with model.norm.weight's first element a NaN.
func nanAt(raw []byte) []byte {
	n := binary.LittleEndian.Uint64(raw)
	var h map[string]tensorInfo
	json.Unmarshal(raw[8:8+n], &h)
	out := bytes.Clone(raw)
	binary.LittleEndian.PutUint32(out[8+int(n)+int(h["model.norm.weight"].Offsets[0]):], 0x7fc00000)
	return out
}

package model

import (
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

func layout(dtype string, width int) Layout {
	return Layout{
		Namespace: index.Namespace{
			Model:       "m",
			Layout:      index.KVLayout{Layers: 4, KVHeads: 8, HeadDim: 128, DType: dtype, TPSize: 1},
			BlockTokens: 16,
		},
		DTypeBytes: width,
	}
}

func TestLayoutSizes(t *testing.T) {
	l := layout("bf16", 2)
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	// K and V, 8 heads of 128 bf16 elements, per token and layer.
	if got := l.TokenLayerBytes(); got != 2*8*128*2 {
		t.Errorf("token layer bytes %d", got)
	}
	if got := l.LayerBytes(); got != 2*8*128*2*16 {
		t.Errorf("layer bytes %d", got)
	}
	if got, want := l.BlockBytes(), l.Namespace.BlockBytes(); got != want {
		t.Errorf("block bytes %d, the namespace says %d", got, want)
	}
}

func TestLayoutValidate(t *testing.T) {
	if err := layout("bf16", 4).Validate(); !errors.Is(err, ErrBadLayout) {
		t.Errorf("bf16 at 4 bytes: %v, want ErrBadLayout", err)
	}
	if err := layout("bf16", 0).Validate(); !errors.Is(err, ErrBadLayout) {
		t.Errorf("0 dtype bytes: %v, want ErrBadLayout", err)
	}
	// A dtype index does not know is taken at its stated width.
	if err := layout("mxfp4x2", 1).Validate(); err != nil {
		t.Errorf("unknown dtype: %v", err)
	}
	l := layout("bf16", 2)
	l.Namespace.BlockTokens = 0
	if err := l.Validate(); !errors.Is(err, ErrBadLayout) || !errors.Is(err, index.ErrInvalidNamespace) {
		t.Errorf("bad namespace: %v, want ErrBadLayout and index.ErrInvalidNamespace", err)
	}
}

func TestCheckBatch(t *testing.T) {
	toks := []uint32{1, 2, 3}
	for _, tc := range []struct {
		name   string
		batch  []Seq
		decode bool
		ok     bool
	}{
		{"empty", nil, false, false},
		{"prefill", []Seq{{Tokens: toks}, {Tokens: toks, Cached: 2}}, false, true},
		{"all cached", []Seq{{Tokens: toks, Cached: 3}}, false, false},
		{"negative cached", []Seq{{Tokens: toks, Cached: -1}}, false, false},
		{"decode", []Seq{{Tokens: toks, Cached: 2}}, true, true},
		{"decode of two", []Seq{{Tokens: toks, Cached: 1}}, true, false},
	} {
		err := CheckBatch(tc.batch, tc.decode)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrBadBatch) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

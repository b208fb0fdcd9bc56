package tiny

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"

	"github.com/kvstrata/kvstrata/engine/tokenizer"
	"github.com/kvstrata/kvstrata/index"
)

// Config is a tiny model's shape and settings; the zero value is valid.
type Config struct {
	// Model names the model, the namespace's model. The default is "tiny".
	Model string
	// Layers is the number of transformer layers. The default is 2.
	Layers int
	// Dim is the width of the residual stream. The default is 64.
	Dim int
	// Heads is the number of query heads. The default is 4.
	Heads int
	// KVHeads is the number of key/value heads, a divisor of Heads: each
	// serves Heads/KVHeads query heads (grouped-query attention). The
	// default is 2.
	KVHeads int
	// HeadDim is the dimension of one head, even (RoPE rotates pairs).
	// The default is 16.
	HeadDim int
	// Hidden is the width of the SwiGLU MLP. The default is 3·Dim.
	Hidden int
	// Vocab is the number of token ids: the embedding's rows, also the
	// output projection's (tied). The default is tokenizer.O200kVocab
	// (200,019), which makes the embedding 51 MB of float32.
	Vocab int
	// BlockTokens is the block size in tokens. The default is 16.
	BlockTokens int
	// ContextLen is the longest sequence, in tokens. The default is 4096.
	ContextLen int
	// RopeTheta is the rotary embedding's base. The default is 10000.
	RopeTheta float64
	// NormEps is RMSNorm's epsilon. The default is 1e-5.
	NormEps float64
	// Seed chooses the weights (see weights.go) when Weights is empty.
	// The default is 1.
	Seed uint64
	// Weights, when set, is the path of a safetensors file the weights
	// are read from instead (see safetensors.go); its tensors must have
	// the shapes this config gives.
	Weights string
	// Workers is how many goroutines a step's independent rows are
	// spread over; the result does not depend on it. The default is
	// runtime.GOMAXPROCS(0).
	Workers int
}

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("tiny: bad config")

// EnsureDefaults fills c's zero fields with their documented defaults.
func (c *Config) EnsureDefaults() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	if c.Model == "" {
		c.Model = "tiny"
	}
	def(&c.Layers, 2)
	def(&c.Dim, 64)
	def(&c.Heads, 4)
	def(&c.KVHeads, 2)
	def(&c.HeadDim, 16)
	def(&c.Hidden, 3*c.Dim)
	def(&c.Vocab, tokenizer.O200kVocab)
	def(&c.BlockTokens, 16)
	def(&c.ContextLen, 4096)
	def(&c.Workers, runtime.GOMAXPROCS(0))
	if c.RopeTheta == 0 {
		c.RopeTheta = 10000
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// Validate reports every problem of c, each naming its field, in one error
// wrapping ErrBadConfig, or nil. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var probs []string
	bad := func(f string, args ...any) { probs = append(probs, fmt.Sprintf(f, args...)) }
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", c.Layers}, {"dim", c.Dim}, {"heads", c.Heads}, {"kv heads", c.KVHeads}, {"head dim", c.HeadDim},
		{"hidden", c.Hidden}, {"vocab", c.Vocab}, {"block tokens", c.BlockTokens}, {"context len", c.ContextLen}, {"workers", c.Workers}} {
		if f.v <= 0 {
			bad("%s is %d, must be > 0", f.name, f.v)
		}
	}
	if c.KVHeads > 0 && c.Heads%c.KVHeads != 0 {
		bad("heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	}
	if c.HeadDim%2 != 0 {
		bad("head dim is %d, must be even", c.HeadDim)
	}
	if c.BlockTokens > index.MaxBlockTokens {
		bad("block tokens is %d, must be at most %d", c.BlockTokens, index.MaxBlockTokens)
	}
	if int64(c.Vocab)*int64(c.Dim) > 1<<31 {
		bad("vocab·dim is %d, must be at most 2³¹", int64(c.Vocab)*int64(c.Dim))
	}
	if !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0) {
		bad("rope theta is %v, must be finite and > 1", c.RopeTheta)
	}
	if !(c.NormEps > 0) || c.NormEps > 1 {
		bad("norm eps is %v, must be in (0, 1]", c.NormEps)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

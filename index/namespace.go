package index

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// KVLayout describes how one engine lays out the KV tensors of a block. Two
// engines can share blocks only when their layouts are identical, so every
// field takes part in the namespace seed.
type KVLayout struct {
	Layers  int    `json:"layers"`   // transformer layers held in one block, > 0
	KVHeads int    `json:"kv_heads"` // KV heads held by this rank (after tensor parallelism), > 0
	HeadDim int    `json:"head_dim"` // dimension of one head, > 0
	DType   string `json:"dtype"`    // element type as the engine names it: "bf16", "fp16", "fp8_e4m3", …
	TPRank  int    `json:"tp_rank"`  // tensor-parallel rank, 0 ≤ TPRank < TPSize
	TPSize  int    `json:"tp_size"`  // tensor-parallel world size, > 0; 0 is read as 1
}

// Namespace is the identity of a family of blocks that can be exchanged: one
// model, one KV layout, one block size and, optionally, one tenant. Blocks of
// two namespaces never mix because the namespace seeds the first hash of every
// chain (see Namespace.Seed).
type Namespace struct {
	Model       string   `json:"model"`        // model name or checkpoint id, non-empty
	Layout      KVLayout `json:"layout"`       // KV tensor layout
	BlockTokens int      `json:"block_tokens"` // tokens per block, 1…65536
	// TenantSalt, when set, keeps one tenant from probing another's prompts:
	// the same tokens hash differently under different salts.
	TenantSalt string `json:"tenant_salt,omitempty"`
}

// ErrInvalidNamespace marks a namespace that fails Validate.
var ErrInvalidNamespace = errors.New("index: invalid namespace")

// MaxBlockTokens is the largest block size a namespace may declare.
const MaxBlockTokens = 1 << 16

// Validate reports every problem with ns in one error wrapping
// ErrInvalidNamespace, or nil.
func (ns Namespace) Validate() error {
	var probs []string
	if ns.Model == "" {
		probs = append(probs, "model is empty")
	}
	for _, f := range [...]struct{ name, v string }{{"model", ns.Model}, {"dtype", ns.Layout.DType}, {"tenant salt", ns.TenantSalt}} {
		if strings.ContainsAny(f.v, "\n\x00") {
			probs = append(probs, f.name+" contains a newline or NUL byte")
		}
	}
	if ns.Layout.DType == "" {
		probs = append(probs, "dtype is empty")
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", ns.Layout.Layers}, {"kv heads", ns.Layout.KVHeads}, {"head dim", ns.Layout.HeadDim}} {
		if f.v <= 0 {
			probs = append(probs, fmt.Sprintf("%s is %d, must be > 0", f.name, f.v))
		}
	}
	if ns.Layout.TPSize < 0 {
		probs = append(probs, fmt.Sprintf("tp size is %d, must be ≥ 0", ns.Layout.TPSize))
	}
	if ns.Layout.TPRank < 0 || ns.Layout.TPRank >= max(ns.Layout.TPSize, 1) {
		probs = append(probs, fmt.Sprintf("tp rank %d is outside [0, %d)", ns.Layout.TPRank, max(ns.Layout.TPSize, 1)))
	}
	if ns.BlockTokens < 1 || ns.BlockTokens > MaxBlockTokens {
		probs = append(probs, fmt.Sprintf("block tokens is %d, must be in [1, %d]", ns.BlockTokens, MaxBlockTokens))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidNamespace, strings.Join(probs, "; "))
}

// Canonical is the text from which the namespace seed is hashed: one
// "key=value" line per field, in this fixed order, each ending in '\n',
// after the header line "kvstrata-namespace-v1". TPSize 0 is written as 1.
// It is the part of the hashing scheme other languages must reproduce byte
// for byte; testdata/hash_vectors.json carries examples.
func (ns Namespace) Canonical() string {
	var b strings.Builder
	line := func(k, v string) { b.WriteString(k); b.WriteByte('='); b.WriteString(v); b.WriteByte('\n') }
	b.WriteString("kvstrata-namespace-v1\n")
	line("model", ns.Model)
	line("layers", strconv.Itoa(ns.Layout.Layers))
	line("kv_heads", strconv.Itoa(ns.Layout.KVHeads))
	line("head_dim", strconv.Itoa(ns.Layout.HeadDim))
	line("dtype", ns.Layout.DType)
	line("tp_rank", strconv.Itoa(ns.Layout.TPRank))
	line("tp_size", strconv.Itoa(max(ns.Layout.TPSize, 1)))
	line("block_tokens", strconv.Itoa(ns.BlockTokens))
	line("tenant_salt", ns.TenantSalt)
	return b.String()
}

// Seed is xxhash64 of Canonical(). It is also the namespace's NamespaceID.
func (ns Namespace) Seed() uint64 { return xxhash.Sum64String(ns.Canonical()) }

// ID is the NamespaceID under which the namespace's blocks are keyed.
func (ns Namespace) ID() NamespaceID { return NamespaceID(ns.Seed()) }

// BlockBytes is the size in bytes of one block's K and V tensors when the
// dtype's width is known ("fp32", "fp16", "bf16", "fp8*", "int8"), else 0.
func (ns Namespace) BlockBytes() int {
	var width int
	switch d := strings.ToLower(ns.Layout.DType); {
	case d == "fp32" || d == "float32":
		width = 4
	case d == "fp16" || d == "bf16" || d == "float16" || d == "bfloat16":
		width = 2
	case strings.HasPrefix(d, "fp8") || d == "int8":
		width = 1
	default:
		return 0
	}
	return 2 * ns.Layout.Layers * ns.Layout.KVHeads * ns.Layout.HeadDim * width * ns.BlockTokens
}

// Hashes returns the chained hashes of the full blocks of tokens under ns;
// a trailing partial block has no hash. See ChainHash.
func (ns Namespace) Hashes(tokens []uint32) []Hash {
	return AppendHashes(nil, ns.Seed(), tokens, ns.BlockTokens)
}

package sched

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/model"
)

// Config is an engine's settings. Model is required; every other zero field
// takes the default its comment gives (EnsureDefaults), and Validate reports
// every field that is wrong.
type Config struct {
	// Model computes the steps. Required. The engine is its only user.
	Model model.Model

	// Blocks is the number of blocks of the worker's GPU ("HBM") block
	// pool; the worker's KV memory is one arena of Blocks ×
	// Layout.BlockBytes() bytes. The default holds 65536 tokens (4096
	// blocks of 16 tokens), the sim model's default KV capacity.
	Blocks int
	// MaxNumSeqs bounds the sequences in the running batch (vLLM's
	// --max-num-seqs). The default is 256, vLLM's.
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens one iteration computes, decode
	// tokens and prefill chunks together (vLLM's
	// --max-num-batched-tokens); a prompt longer than what is left of it is
	// prefilled in chunks over several iterations. At least MaxNumSeqs, as
	// vLLM requires, so that every running sequence decodes each
	// iteration. The default is 2048 (vLLM's for online serving), or
	// MaxNumSeqs if that is larger.
	MaxNumBatchedTokens int
	// ContextLen is the longest sequence, prompt plus MaxTokens, the engine
	// accepts (vLLM's --max-model-len); longer requests fail with
	// ErrTooLong. At most Blocks × BlockTokens, which is also the default.
	ContextLen int
	// MaxWaiting bounds the requests queued for admission; Generate
	// returns ErrOverloaded beyond it. The default is 1024.
	MaxWaiting int

	// Connector is the way to kvstrata; nil runs without the cache (every
	// block not in the pool is computed).
	Connector Connector
	// CacheTimeout bounds one onboarding (Lookup and Load): a cache slower
	// than that degrades to recomputing what it has not delivered. The
	// default is 500 ms.
	CacheTimeout time.Duration
	// TransferTimeout bounds a disaggregated handoff's cache operations:
	// the prefill side's Store and the decode side's Load of the named
	// blocks. The default is 30 s.
	TransferTimeout time.Duration

	// Events, if not nil, receives every block pool event, with a Flush
	// after each engine step that produced some.
	Events EventSink
	// Registerer, if not nil, gets the engine's metrics (vLLM's names, see
	// metrics.go), each labelled model_name=ModelName.
	Registerer prometheus.Registerer
	// ModelName is the served model's name, the metrics' model_name label.
	// The default is the model's namespace model.
	ModelName string
	// Logger receives the engine's lines. The default is slog.Default().
	Logger *slog.Logger
	// Now is the engine's clock: arrivals, first tokens, inter-token gaps
	// and queue times are stamped with it. The default is time.Now; a
	// driven engine (NewDriven) in virtual time is given the virtual
	// clock its model sleeps on.
	Now func() time.Time
}

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("sched: bad config")

// Default values of Config's fields.
const (
	DefaultPoolTokens          = 65536
	DefaultMaxNumSeqs          = 256
	DefaultMaxNumBatchedTokens = 2048
	DefaultMaxWaiting          = 1024
	DefaultCacheTimeout        = 500 * time.Millisecond
	DefaultTransferTimeout     = 30 * time.Second
)

// EnsureDefaults fills c's zero fields with their defaults. The ones that
// depend on the model's layout are left alone while Model is nil.
func (c *Config) EnsureDefaults() {
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = max(DefaultMaxNumBatchedTokens, c.MaxNumSeqs)
	}
	if c.MaxWaiting == 0 {
		c.MaxWaiting = DefaultMaxWaiting
	}
	if c.CacheTimeout == 0 {
		c.CacheTimeout = DefaultCacheTimeout
	}
	if c.TransferTimeout == 0 {
		c.TransferTimeout = DefaultTransferTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Model == nil {
		return
	}
	l := c.Model.Layout()
	bt := l.Namespace.BlockTokens
	if c.Blocks == 0 && bt > 0 {
		c.Blocks = (DefaultPoolTokens + bt - 1) / bt
	}
	if c.ContextLen == 0 {
		c.ContextLen = c.Blocks * bt
	}
	if c.ModelName == "" {
		c.ModelName = l.Namespace.Model
	}
}

// Validate reports every problem of c, each naming its field, in one error
// wrapping ErrBadConfig, or nil.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	bt := 0
	if c.Model == nil {
		bad("Model is nil")
	} else if err := c.Model.Layout().Validate(); err != nil {
		bad("Model's layout: %v", err)
	} else {
		bt = c.Model.Layout().Namespace.BlockTokens
	}
	if c.Blocks < 1 || c.Blocks > 1<<31-2 {
		bad("Blocks is %d, must be in [1, %d]", c.Blocks, 1<<31-2)
	}
	if c.MaxNumSeqs < 1 {
		bad("MaxNumSeqs is %d, must be ≥ 1", c.MaxNumSeqs)
	}
	if c.MaxNumBatchedTokens < max(c.MaxNumSeqs, 1) {
		bad("MaxNumBatchedTokens is %d, must be ≥ MaxNumSeqs (%d)", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	}
	if c.ContextLen < 2 {
		bad("ContextLen is %d, must be ≥ 2 (a prompt token and a generated one)", c.ContextLen)
	} else if bt > 0 && c.Blocks > 0 && c.ContextLen > c.Blocks*bt {
		bad("ContextLen is %d, more than the pool's %d blocks of %d tokens hold", c.ContextLen, c.Blocks, bt)
	}
	if c.MaxWaiting < 1 {
		bad("MaxWaiting is %d, must be ≥ 1", c.MaxWaiting)
	}
	if c.CacheTimeout < 0 {
		bad("CacheTimeout is %v, must be > 0", c.CacheTimeout)
	}
	if c.TransferTimeout < 0 {
		bad("TransferTimeout is %v, must be > 0", c.TransferTimeout)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

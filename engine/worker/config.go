package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/engine/openai"
)

// Roles a worker plays in a deployment.
const (
	// RoleAggregated prefills and decodes the requests it is given.
	RoleAggregated = "aggregated"
	// RolePrefill prefills every request for a decode worker elsewhere:
	// each request is served as if it carried kv_transfer_params
	// {"do_remote_decode": true} (unless it carries params of its own),
	// so its prompt's full blocks are written to kvstrata and its
	// response names them.
	RolePrefill = "prefill"
	// RoleDecode serves requests as they come, typically with the
	// kv_transfer_params a prefill worker returned, onboarding the
	// prefilled blocks from kvstrata.
	RoleDecode = "decode"
)

// Model backends.
const (
	// ModelSim is engine/model/sim: a model that costs time, not FLOPs.
	ModelSim = "sim"
	// ModelTiny is engine/model/tiny: a real small transformer on the CPU.
	ModelTiny = "tiny"
)

// Defaults of Config's fields (see DefaultConfig).
const (
	// DefaultListen is vLLM's default HTTP port, on loopback.
	DefaultListen = "127.0.0.1:8000"
	// DefaultCache is a kvstrata node's default gRPC address.
	DefaultCache = "127.0.0.1:7070"
	// DefaultKVEvents is vLLM's default KV-events endpoint (its
	// KVEventsConfig.endpoint, tcp://*:5557), on loopback.
	DefaultKVEvents = "tcp://127.0.0.1:5557"
	// DefaultKVEventsReplay is the port after DefaultKVEvents. vLLM opens
	// no replay socket unless told to (replay_endpoint is None); a worker
	// opens one by default so that a subscriber that sees a gap in the
	// sequence numbers can fill it.
	DefaultKVEventsReplay = "tcp://127.0.0.1:5558"
	// DefaultSimModelName and DefaultTinyModelName are the served model
	// names of the two backends.
	DefaultSimModelName  = "kvstrata-sim"
	DefaultTinyModelName = "kvstrata-tiny"
	// DefaultBlocks is the pool's size in blocks: 65536 tokens of 16.
	DefaultBlocks = 4096
	// DefaultTinyContextLen is the tiny model's default context length.
	DefaultTinyContextLen = 4096
)

// Config is one worker's settings. DefaultConfig gives every default; on a
// Config built by hand, EnsureDefaults fills the zero fields whose zero
// value means nothing else — every field but Cache, KVEvents and
// KVEventsReplay, for which "" means off.
type Config struct {
	// Role is aggregated, prefill or decode (see the Role constants). The
	// default is aggregated. Prefill and decode need a Cache: the handoff
	// goes through it.
	Role string
	// Model is the backend: sim or tiny. The default is sim.
	Model string
	// ModelName is the served model name: the id /v1/models lists, the one
	// requests name, the metrics' model_name label. The default is
	// "kvstrata-sim" or "kvstrata-tiny".
	ModelName string

	// Listen is the HTTP address of the OpenAI API, /health and /metrics.
	// The default is 127.0.0.1:8000, vLLM's port.
	Listen string
	// Cache is the gRPC address of the worker's kvstrata node; "" runs
	// without a cache (every block not in the pool is computed).
	// DefaultConfig's is 127.0.0.1:7070, a node's default. A node that
	// is down when the worker starts, or goes down later, is no error: the
	// worker recomputes and counts it until the node is back.
	Cache string
	// KVEvents is the ZMQ endpoint the PUB socket of the worker's KV
	// events listens on, as vLLM's; "" publishes none. DefaultConfig's is
	// tcp://127.0.0.1:5557, vLLM's port.
	KVEvents string
	// KVEventsReplay is the ZMQ endpoint of the replay (ROUTER) socket; ""
	// opens none. Only with KVEvents. DefaultConfig's is
	// tcp://127.0.0.1:5558.
	KVEventsReplay string
	// KVEventsEncoding is how events are written: "arrays" (vLLM's tagged
	// arrays, the default) or "maps" (maps with a "type" field).
	KVEventsEncoding string
	// KVEventsConnect makes the PUB socket connect to KVEvents — a
	// frontend's listening SUB socket (its --kv-events-bind) — instead of
	// listening on it, and connect again whenever the connection is lost.
	KVEventsConnect bool
	// KVEventsTopic is the first frame of every event message ("" by
	// default, as vLLM's). A frontend that many workers connect to tells
	// them apart by it.
	KVEventsTopic string

	// SimProfile is the path of a sim profile file (engine/model/sim's
	// Profile JSON); "" is the default profile, Dynamo mocker's.
	SimProfile string
	// Speedup divides every modelled sim time (replays). The default is 1.
	Speedup float64
	// TokenBytes is the sim model's KV bytes per token per layer (4
	// layers), a multiple of 4. The default is 64.
	TokenBytes int
	// SimSleep waits out a sim step's modelled time, or returns ctx's
	// error when ctx ends first. The default sleeps in real time; a
	// sim.VirtualClock's Sleep runs the worker in virtual time, and a
	// wrapper can add up the modelled time (the overhead benchmark does).
	SimSleep func(ctx context.Context, d time.Duration) error
	// TinySeed chooses the tiny model's weights when TinyWeights is "".
	// The default is 1.
	TinySeed uint64
	// TinyWeights is the path of a safetensors file of tiny weights
	// (engine/model/tiny's format); "" generates them from TinySeed.
	TinyWeights string

	// Blocks is the GPU block pool's size in blocks of 16 tokens. The
	// default is 4096 (65536 tokens).
	Blocks int
	// MaxNumSeqs bounds the running batch (vLLM's --max-num-seqs). The
	// default is 256.
	MaxNumSeqs int
	// MaxNumBatchedTokens bounds the tokens of one step (vLLM's
	// --max-num-batched-tokens). The default is 2048, or MaxNumSeqs if
	// larger.
	MaxNumBatchedTokens int
	// ContextLen is the longest request, prompt plus max_tokens (vLLM's
	// --max-model-len). The default is the pool's tokens for sim, 4096 for
	// tiny (its rotary table's length); at most the pool's tokens.
	ContextLen int

	// HTTP bounds what clients' connections may hold of the HTTP server:
	// the most connections (displacing the slowest sender for a new one),
	// the time to send headers and a body, keep-alive idleness, and how
	// long a response may wait for a client that stopped reading. Every
	// zero field has its default (see openai.Limits).
	HTTP openai.Limits

	// Logger receives the worker's lines. The default is slog.Default().
	Logger *slog.Logger
	// Collectors are more metrics /metrics serves beside the worker's own
	// (the GPUs', which the binary reads). Default none.
	Collectors []prometheus.Collector
}

// DefaultConfig is a worker with every default: an aggregated sim worker
// on 127.0.0.1:8000 whose cache is the node at 127.0.0.1:7070, publishing
// KV events on tcp://127.0.0.1:5557 (replay on 5558).
func DefaultConfig() Config {
	c := Config{Cache: DefaultCache, KVEvents: DefaultKVEvents, KVEventsReplay: DefaultKVEventsReplay}
	c.EnsureDefaults()
	return c
}

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("worker: bad config")

// EnsureDefaults fills c's zero fields with their defaults, except Cache,
// KVEvents and KVEventsReplay, whose zero value means off.
func (c *Config) EnsureDefaults() {
	if c.Role == "" {
		c.Role = RoleAggregated
	}
	if c.Model == "" {
		c.Model = ModelSim
	}
	if c.ModelName == "" {
		switch c.Model {
		case ModelSim:
			c.ModelName = DefaultSimModelName
		case ModelTiny:
			c.ModelName = DefaultTinyModelName
		}
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.KVEventsEncoding == "" {
		c.KVEventsEncoding = kvevents.TaggedArrays.String()
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.TokenBytes == 0 {
		c.TokenBytes = 64
	}
	if c.TinySeed == 0 {
		c.TinySeed = 1
	}
	if c.Blocks == 0 {
		c.Blocks = DefaultBlocks
	}
	if c.ContextLen == 0 {
		c.ContextLen = c.Blocks * blockTokens
		if c.Model == ModelTiny {
			c.ContextLen = min(c.ContextLen, DefaultTinyContextLen)
		}
	}
	c.HTTP.EnsureDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// blockTokens is the block size of both backends.
const blockTokens = 16

// Validate reports every problem of c, each naming its field, in one error
// wrapping ErrBadConfig, or nil. Call it after EnsureDefaults. It checks
// what can be checked without opening anything: the engine's own limits
// (MaxNumSeqs against MaxNumBatchedTokens, …) are checked by Start.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	switch c.Role {
	case RoleAggregated:
	case RolePrefill, RoleDecode:
		if c.Cache == "" {
			bad("Role %s needs a Cache: the handoff between prefill and decode goes through kvstrata", c.Role)
		}
	default:
		bad("Role %q is unknown: aggregated, prefill or decode", c.Role)
	}
	switch c.Model {
	case ModelSim, ModelTiny:
		if c.ModelName == "" || strings.TrimSpace(c.ModelName) != c.ModelName {
			bad("ModelName %q must be non-empty, without surrounding spaces", c.ModelName)
		}
	default:
		bad("Model %q is unknown: sim or tiny", c.Model)
	}
	if err := checkAddr(c.Listen); err != nil {
		bad("Listen: %v", err)
	}
	if c.Cache != "" {
		if err := checkAddr(c.Cache); err != nil {
			bad("Cache: %v", err)
		}
	}
	for _, e := range []struct{ name, v string }{{"KVEvents", c.KVEvents}, {"KVEventsReplay", c.KVEventsReplay}} {
		if e.v != "" {
			if err := checkEndpoint(e.v); err != nil {
				bad("%s: %v", e.name, err)
			}
		}
	}
	if c.KVEventsReplay != "" && c.KVEvents == "" {
		bad("KVEventsReplay is %q but KVEvents is off: a replay socket needs the events it replays", c.KVEventsReplay)
	}
	if c.KVEventsReplay != "" && c.KVEventsReplay == c.KVEvents {
		bad("KVEventsReplay and KVEvents are both %q", c.KVEvents)
	}
	if _, err := kvevents.ParseEncoding(c.KVEventsEncoding); err != nil {
		bad("KVEventsEncoding %q is unknown: arrays or maps", c.KVEventsEncoding)
	}
	if !(c.Speedup > 0) || math.IsInf(c.Speedup, 0) {
		bad("Speedup is %v, must be > 0", c.Speedup)
	}
	if c.TokenBytes <= 0 || c.TokenBytes%4 != 0 {
		bad("TokenBytes is %d, must be a positive multiple of 4", c.TokenBytes)
	}
	if c.Model == ModelTiny && c.SimProfile != "" {
		bad("SimProfile is set but Model is tiny: a profile times the sim model only")
	}
	if c.Model == ModelSim && c.TinyWeights != "" {
		bad("TinyWeights is set but Model is sim")
	}
	if c.Blocks < 1 || c.Blocks > 1<<24 {
		bad("Blocks is %d, must be in [1, %d]", c.Blocks, 1<<24)
	}
	if c.MaxNumSeqs < 0 {
		bad("MaxNumSeqs is %d, must be ≥ 1 (0: the default)", c.MaxNumSeqs)
	}
	if c.MaxNumBatchedTokens < 0 {
		bad("MaxNumBatchedTokens is %d, must be ≥ 1 (0: the default)", c.MaxNumBatchedTokens)
	}
	if c.MaxNumSeqs > 0 && c.MaxNumBatchedTokens > 0 && c.MaxNumBatchedTokens < c.MaxNumSeqs {
		bad("MaxNumBatchedTokens is %d, must be ≥ MaxNumSeqs (%d), as vLLM requires", c.MaxNumBatchedTokens, c.MaxNumSeqs)
	}
	if c.ContextLen < 2 {
		bad("ContextLen is %d, must be ≥ 2", c.ContextLen)
	} else if c.Blocks > 0 && c.ContextLen > c.Blocks*blockTokens {
		bad("ContextLen is %d, more than the pool's %d blocks of %d tokens hold", c.ContextLen, c.Blocks, blockTokens)
	}
	for _, p := range c.HTTP.Problems() {
		bad("HTTP: %s", p)
	}
	if c.Logger == nil {
		bad("Logger is nil")
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

// checkAddr checks a host:port address.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if port == "" {
		return fmt.Errorf("%q has no port", addr)
	}
	return nil
}

// checkEndpoint checks a ZMQ tcp endpoint, tcp://host:port.
func checkEndpoint(ep string) error {
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("%q is not a tcp://host:port endpoint", ep)
	}
	if err := checkAddr(addr); err != nil {
		return fmt.Errorf("endpoint %q: %v", ep, err)
	}
	return nil
}

// namespaceModel is the model name of the worker's block namespace: the
// backend's name, and for tiny which weights, so that workers of different
// weights never share blocks.
func (c *Config) namespaceModel(weightsDigest string) string {
	if c.Model == ModelTiny {
		if weightsDigest != "" {
			return "tiny-w" + weightsDigest
		}
		return fmt.Sprintf("tiny-seed%d", c.TinySeed)
	}
	return "sim"
}

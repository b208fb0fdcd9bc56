package frontend

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/router/policy"
)

// Defaults.
const (
	DefaultCacheTimeout   = 50 * time.Millisecond
	DefaultMaxMigrations  = 3
	DefaultQueueSize      = 256
	DefaultQueueWait      = 10 * time.Second
	DefaultHealthInterval = 500 * time.Millisecond
	DefaultHealthTimeout  = time.Second
	DefaultProbeMax       = 8 * time.Second
	// A worker's stream is silent for seconds at most while it is well
	// (a long prefill, a full batch); one whose health checks fail too is
	// frozen or gone. A prefill behind a full queue may take minutes.
	DefaultStallTimeout = 15 * time.Second
	DefaultStallLimit   = 2 * time.Minute
)

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("frontend: bad config")

// WorkerSpec is one worker of the static list.
type WorkerSpec struct {
	// URL is the worker's OpenAI API base, http://host:port.
	URL string
	// Events is the ZMQ endpoint of its KV events (tcp://host:port); ""
	// means none: the router then knows nothing of its pool.
	Events string
	// Replay is the ZMQ endpoint of its events' replay socket; "" none.
	Replay string
}

// Config is a Router's settings; zero fields take their defaults.
type Config struct {
	// Workers is the static list of workers, at least one, each URL once.
	// A worker is named by its URL in metrics and logs.
	Workers []WorkerSpec
	// Namespace is the workers' block namespace (their model's): prompts
	// are hashed in it, for the KV index and the cache.
	Namespace index.Namespace
	// WorkerModel is the model name sent to workers; "" sends none (a
	// worker then serves its own).
	WorkerModel string
	// WorkerBlocks is each worker's pool in blocks, for the busy
	// threshold; 0 means unknown (never busy by blocks).
	WorkerBlocks int
	// Cache is the gRPC address of a cache node asked where a prompt's
	// blocks are, per tier; "" asks none (no tier credit).
	Cache string
	// CacheTimeout bounds that lookup; past it the request is routed
	// without tier credit. The default is 50 ms.
	CacheTimeout time.Duration
	// Policy is the routing policy's settings (policy, temperature, busy
	// thresholds...). Its BlockTokens is the Namespace's.
	Policy policy.Config
	// MaxMigrations bounds how often one request moves to another worker
	// after its worker failed. The default is 3; negative means never.
	MaxMigrations int
	// QueueSize bounds the requests waiting for a worker that is not
	// busy; past it a request is answered 503. The default is 256.
	QueueSize int
	// QueueWait bounds one request's wait in the queue; past it, 503.
	// The default is 10 s.
	QueueWait time.Duration
	// HealthInterval is how often each healthy worker's /health is asked.
	// The default is 500 ms: a worker whose health fails leaves the
	// candidates within about a second.
	HealthInterval time.Duration
	// HealthTimeout bounds one health check. The default is 1 s.
	HealthTimeout time.Duration
	// ProbeMax is the longest wait between probes of an unhealthy worker;
	// they start at HealthInterval and double. The default is 8 s.
	ProbeMax time.Duration
	// StallTimeout and StallLimit bound the silence of a worker's stream,
	// its connection open: from sending the request until the worker's
	// first token (bytes before it do not count), then from the last byte.
	// A stream silent for StallTimeout whose worker is also failing its
	// health checks (a frozen or dead process), or silent for StallLimit
	// whatever its health (a request stuck in a live worker), stalled: the
	// worker leaves the candidates and the request moves on (migration
	// cause "stalled"). StallLimit must allow for a long prefill behind a
	// full queue. The defaults are 15 s and 2 min; negative means none.
	StallTimeout time.Duration
	StallLimit   time.Duration
	// Registerer gets the frontend's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives worker failures and migrations. The default is
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.CacheTimeout == 0 {
		c.CacheTimeout = DefaultCacheTimeout
	}
	if c.MaxMigrations == 0 {
		c.MaxMigrations = DefaultMaxMigrations
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.QueueWait == 0 {
		c.QueueWait = DefaultQueueWait
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.ProbeMax == 0 {
		c.ProbeMax = DefaultProbeMax
	}
	if c.StallLimit == 0 {
		c.StallLimit = DefaultStallLimit
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.Policy.BlockTokens == 0 {
		c.Policy.BlockTokens = c.Namespace.BlockTokens
	}
	if c.Policy.BlockBytes == 0 {
		c.Policy.BlockBytes = int64(c.Namespace.BlockBytes())
	}
	c.Policy.EnsureDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem of c in one error wrapping ErrBadConfig.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if len(c.Workers) == 0 {
		bad("no workers")
	}
	seen := map[string]bool{}
	for _, w := range c.Workers {
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("worker URL %q is not http://host:port", w.URL)
		}
		if seen[w.URL] {
			bad("worker %q is listed twice", w.URL)
		}
		seen[w.URL] = true
		if w.Replay != "" && w.Events == "" {
			bad("worker %q has a replay endpoint but no events endpoint", w.URL)
		}
	}
	if err := c.Namespace.Validate(); err != nil {
		bad("namespace: %v", err)
	}
	if c.Policy.BlockTokens != c.Namespace.BlockTokens {
		bad("policy block tokens %d differ from the namespace's %d", c.Policy.BlockTokens, c.Namespace.BlockTokens)
	}
	if err := c.Policy.Validate(); err != nil {
		bad("%v", err)
	}
	for name, d := range map[string]time.Duration{"cache timeout": c.CacheTimeout, "queue wait": c.QueueWait,
		"health interval": c.HealthInterval, "health timeout": c.HealthTimeout, "probe max": c.ProbeMax} {
		if d < 0 {
			bad("%s is %v, must be > 0", name, d)
		}
	}
	if c.QueueSize < 0 {
		bad("queue size is %d, must be ≥ 0", c.QueueSize)
	}
	if c.WorkerBlocks < 0 {
		bad("worker blocks is %d, must be ≥ 0", c.WorkerBlocks)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

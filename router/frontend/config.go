package frontend

import (
	"errors"
	"fmt"
	"log/slog"
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
	// DefaultDiscoverInterval is how often a discovering Router lists the
	// registry.
	DefaultDiscoverInterval = time.Second
	// DefaultDisaggMinUncached is Dynamo's default max_local_prefill_length.
	DefaultDisaggMinUncached = 1000
	// A worker's stream is silent for seconds at most while it is well
	// (a long prefill, a full batch); one whose health checks fail too is
	// frozen or gone. A prefill behind a full queue may take minutes.
	DefaultStallTimeout = 15 * time.Second
	DefaultStallLimit   = 2 * time.Minute
)

// ErrBadConfig marks a Config that fails Validate.
var ErrBadConfig = errors.New("frontend: bad config")

// WorkerSpec is one worker: of the static list, or discovered.
type WorkerSpec struct {
	// URL is the worker's OpenAI API base, http://host:port.
	URL string
	// Events is the ZMQ endpoint of its KV events (tcp://host:port); ""
	// means none: the router then knows nothing of its pool.
	Events string
	// Replay is the ZMQ endpoint of its events' replay socket; "" none.
	Replay string
	// Blocks is its pool in blocks, for the busy threshold; 0 means
	// Config.WorkerBlocks.
	Blocks int
	// Role is RoleAggregated (""), RolePrefill or RoleDecode: the list
	// serves disaggregated when it has prefill and decode workers.
	Role string
	// Topic is the topic of its events (vLLM's KVEventsConfig.topic). With
	// Events, the prefix subscribed to ("" every message). Without Events,
	// the worker's publisher connects to Config.EventsBind and Topic is
	// what tells its messages from the other workers' there.
	Topic string
}

// Config is a Router's settings; zero fields take their defaults.
type Config struct {
	// Workers is the static list of workers, each URL once; at least one
	// unless Discover is set. A worker is named by its URL in metrics and
	// logs.
	Workers []WorkerSpec
	// Discover adds the workers that the cache cluster's registry lists
	// (at Cache; see discover.go) to the static ones, and removes them when
	// the registry no longer lists them.
	Discover bool
	// DiscoverInterval is how often the registry is listed. The default
	// is 1 s.
	DiscoverInterval time.Duration
	// Namespace is the workers' block namespace (their model's): prompts
	// are hashed in it, for the KV index and the cache.
	Namespace index.Namespace
	// WorkerModel is the model name sent to workers; "" sends none (a
	// worker then serves its own).
	WorkerModel string
	// WorkerBlocks is each worker's pool in blocks, for the busy
	// threshold; 0 means unknown (never busy by blocks).
	WorkerBlocks int
	// EventsBind is a ZMQ endpoint the Router's SUB socket listens on, e.g.
	// tcp://0.0.0.0:5557, for workers whose publishers connect in (a
	// WorkerSpec with a Topic and no Events); "" listens on none.
	EventsBind string
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
	// DisaggMinUncached: in disaggregated serving, a request whose
	// uncached tokens on its decode worker (the prompt less that worker's
	// pool overlap and the cache tiers' credit) are at most this many is
	// prefilled there, without a prefill worker. The default is 1000
	// (Dynamo's max_local_prefill_length); negative disaggregates every
	// request.
	DisaggMinUncached int
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
	if c.DiscoverInterval == 0 {
		c.DiscoverInterval = DefaultDiscoverInterval
	}
	if c.DisaggMinUncached == 0 {
		c.DisaggMinUncached = DefaultDisaggMinUncached
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
	if len(c.Workers) == 0 && !c.Discover {
		bad("no workers")
	}
	if c.Discover && c.Cache == "" {
		bad("discovering workers needs a cache node (Cache)")
	}
	seen := map[string]bool{}
	for _, w := range c.Workers {
		probs = append(probs, checkSpec(w)...)
		if seen[w.URL] {
			bad("worker %q is listed twice", w.URL)
		}
		seen[w.URL] = true
	}
	probs = append(probs, roleProblems(c.Workers)...)
	c.validateEvents(bad)
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
		"health interval": c.HealthInterval, "health timeout": c.HealthTimeout, "probe max": c.ProbeMax,
		"discover interval": c.DiscoverInterval} {
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

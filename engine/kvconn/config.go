package kvconn

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/api/client"
)

// Config configures a Conn; zero fields take their defaults (EnsureDefaults).
type Config struct {
	// Addr is the gRPC address of the worker's cache node (host:port). A
	// cluster client is seeded there, so that blocks held by other nodes of
	// its cluster are fetched from them. Required.
	Addr string
	// Client configures every connection to a cache node. Zero fields take
	// the client's defaults, except: Timeout, 5 s (a call without a
	// deadline), and RetryBudget, client.FallbackRetryBudget (500 ms): the
	// cache is optional, so a worker recomputes rather than wait out a
	// node's restart; the offloader keeps trying on its own.
	Client client.Options
	// OffloadQueueBytes bounds the block bytes waiting to be offloaded.
	// Offload drops (and counts) blocks that would take the queue over
	// it, so a slow or absent cache costs the worker this much memory at
	// most. The default is 256 MiB.
	OffloadQueueBytes int64
	// OffloadBatch is the most blocks one offloading Put carries. The
	// default is 64.
	OffloadBatch int
	// OffloadTimeout bounds one offloading Put. The default is 10 s.
	OffloadTimeout time.Duration
	// Backoff is how long a node found unreachable (or silent past a
	// Lookup's deadline) is left alone, doubled after each further failure
	// up to MaxBackoff: meanwhile Lookup, Load and Store fail at once
	// (ErrCacheDown), and the offloader pauses as long before it tries
	// again, so that a down cache is neither waited on by the engine loop,
	// nor hammered, nor piled up on. Defaults 100 ms and 5 s (or Backoff,
	// if longer).
	Backoff, MaxBackoff time.Duration
	// CloseTimeout bounds how long Close waits for queued blocks to be
	// offloaded before it drops the rest. The default is 5 s.
	CloseTimeout time.Duration
	// Registerer, if set, registers the Conn's metrics (see metrics.go);
	// nil: they are kept but not exported.
	Registerer prometheus.Registerer
	// ModelName is the model_name label of every metric, as vLLM's.
	ModelName string
	// Logger logs the cache going away and coming back. The default is
	// slog.Default().
	Logger *slog.Logger
}

// Defaults of Config's fields.
const (
	DefaultOffloadQueueBytes = 256 << 20
	DefaultOffloadBatch      = 64
	DefaultOffloadTimeout    = 10 * time.Second
	DefaultBackoff           = 100 * time.Millisecond
	DefaultMaxBackoff        = 5 * time.Second
	DefaultCloseTimeout      = 5 * time.Second
	DefaultClientTimeout     = 5 * time.Second
)

// ErrInvalidConfig marks a Config that fails Validate.
var ErrInvalidConfig = errors.New("kvconn: invalid config")

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Client.Timeout == 0 {
		c.Client.Timeout = DefaultClientTimeout
	}
	if c.Client.RetryBudget == 0 {
		c.Client.RetryBudget = client.FallbackRetryBudget
	}
	c.Client.EnsureDefaults()
	if c.OffloadQueueBytes == 0 {
		c.OffloadQueueBytes = DefaultOffloadQueueBytes
	}
	if c.OffloadBatch == 0 {
		c.OffloadBatch = DefaultOffloadBatch
	}
	if c.OffloadTimeout == 0 {
		c.OffloadTimeout = DefaultOffloadTimeout
	}
	if c.Backoff == 0 {
		c.Backoff = DefaultBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.Backoff)
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem with c, naming the fields. Call it after
// EnsureDefaults (New does both).
func (c *Config) Validate() error {
	var probs []string
	if c.Addr == "" {
		probs = append(probs, "Addr is empty: the cache node's gRPC address is required")
	}
	if err := c.Client.Validate(); err != nil {
		probs = append(probs, "Client: "+err.Error())
	}
	if c.OffloadQueueBytes < 0 {
		probs = append(probs, fmt.Sprintf("OffloadQueueBytes is %d, must not be negative", c.OffloadQueueBytes))
	}
	if c.OffloadBatch < 0 {
		probs = append(probs, fmt.Sprintf("OffloadBatch is %d, must not be negative", c.OffloadBatch))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"OffloadTimeout", c.OffloadTimeout}, {"Backoff", c.Backoff},
		{"MaxBackoff", c.MaxBackoff}, {"CloseTimeout", c.CloseTimeout}} {
		if d.v < 0 {
			probs = append(probs, fmt.Sprintf("%s is %v, must not be negative", d.name, d.v))
		}
	}
	if c.MaxBackoff < c.Backoff {
		probs = append(probs, fmt.Sprintf("MaxBackoff %v is shorter than Backoff %v", c.MaxBackoff, c.Backoff))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
	}
	return nil
}

package simulate

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/router/policy"
	tierpolicy "github.com/kvstrata/kvstrata/tiers/policy"
)

// TierModel is what restoring blocks from one cache tier into a worker's
// pool costs in the simulation: Latency once per run of consecutive blocks
// served by the tier, then the block's bytes at Bandwidth.
type TierModel struct {
	Bandwidth float64       // bytes a second, > 0
	Latency   time.Duration // ≥ 0
}

// Time is the modelled time to restore n blocks of blockBytes in one run.
func (m TierModel) Time(n int, blockBytes int64) time.Duration {
	if n <= 0 {
		return 0
	}
	return m.Latency + time.Duration(float64(n)*float64(blockBytes)/m.Bandwidth*float64(time.Second))
}

// Defaults of Config's fields; the package doc says where they come from.
const (
	DefaultWorkers     = 8
	DefaultPoolTokens  = 131072
	DefaultTokenBytes  = 131072 // Llama-3.1-8B, fp16: 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 B
	DefaultBlockTokens = 16
	DefaultDRAMTokens  = 8 << 20  // 1 TiB of 128 KiB tokens
	DefaultSSDTokens   = 64 << 20 // 8 TiB
	DefaultS3Tokens    = 1 << 40  // as good as unbounded

	DefaultScaleInterval = 30 * time.Second
	DefaultStartupDelay  = 60 * time.Second
	DefaultMinWorkers    = 1
	DefaultMaxWorkers    = 16
	DefaultSLOTTFT       = 2 * time.Second
	DefaultSLOTTFTSlack  = 2
	DefaultSLOITL        = 60 * time.Millisecond
)

// SLO is the per-request latency target a row's SLOAttainment counts: a
// request is within it iff it completed, its TTFT ≤ max(TTFT, TTFTSlack ×
// the prefill time of its uncached prompt tokens alone on an idle worker,
// as planner/perf computes it from the profile), and the mean of its
// inter-token latencies ≤ ITL. The slack keeps a flat TTFT target from
// failing prompts that no deployment could serve faster.
type SLO struct {
	// TTFT is the flat target. The default is 2 s.
	TTFT time.Duration
	// TTFTSlack multiplies a request's TTFT alone. The default is 2.
	TTFTSlack float64
	// ITL bounds a request's mean inter-token latency. The default is
	// 60 ms.
	ITL time.Duration
}

// DefaultTiers are the modelled restore costs of DRAM, SSD and S3, in that
// order (see the package doc).
func DefaultTiers() [3]TierModel {
	return [3]TierModel{
		{Bandwidth: 25e9, Latency: 10 * time.Microsecond},
		{Bandwidth: 6e9, Latency: 100 * time.Microsecond},
		{Bandwidth: 2e9, Latency: 20 * time.Millisecond},
	}
}

// Config is one simulated replay's settings. The zero value is usable:
// every zero field takes the default its comment gives (EnsureDefaults),
// and Validate reports every bad field at once.
type Config struct {
	// Workers is the number of simulated workers, the initial number
	// when a scaler sizes them. The default is 8.
	Workers int
	// Scalers, if any, size the workers while the trace runs: every
	// policy (and baseline) is replayed once per scaler, in this order,
	// the rows saying which (Row.Scaler). None keeps Workers all along.
	// A Scaler is asked every ScaleInterval; a worker it adds serves
	// after StartupDelay; its answer is clamped to [MinWorkers,
	// MaxWorkers].
	Scalers []NamedScaler
	// ScaleInterval is the time between a scaler's ticks. The default is
	// 30 s.
	ScaleInterval time.Duration
	// StartupDelay is the time from a worker's add to its first request,
	// counted in its worker-seconds. The default is 60 s; a negative
	// delay is none.
	StartupDelay time.Duration
	// MinWorkers and MaxWorkers bound a scaler's targets. The defaults
	// are 1 and 16 (at least Workers).
	MinWorkers, MaxWorkers int
	// SLO is the target Row.SLOAttainment counts; zero fields take the
	// defaults in SLO's doc.
	SLO SLO
	// Policies are the routing policies replayed, one run each, in this
	// order. The default is random, round-robin, least-loaded, kv-hbm,
	// kv-tiered.
	Policies []policy.Policy
	// Baselines are policies replayed again, after Policies, with workers
	// that have no cache: no Connector (nothing offloaded, nothing
	// onboarded) and a router that sees no cache tiers — the deployment
	// without kvstrata. Their rows' Cache is CacheNone. None by default.
	Baselines []policy.Policy
	// Speedup divides the trace's timestamps. The default is 1.
	Speedup float64
	// Seed seeds the prompts' tokens (as kvctl replay's --seed) and the
	// router's random choices.
	Seed uint64
	// Vocab is the prompts' vocabulary (replay.Prompts). The default is
	// replay.DefaultVocab.
	Vocab int

	// PoolTokens is each worker's GPU KV pool in tokens, also its
	// context length and the sim model's KV capacity (the p of its decode
	// curve). The default is 131072: 16 GiB of Llama-3.1-8B KV (128 KiB a
	// token), what a 40 GB A100 keeps after 16 GB of fp16 weights and
	// activations, and enough for the longest request of the conversation
	// trace (126,527 tokens with its output).
	PoolTokens int
	// BlockTokens is the block size in tokens. The default is 16.
	BlockTokens int
	// TokenBytes is the modelled KV bytes of one token, all layers: a
	// block's bytes are BlockTokens × TokenBytes. The default is 131072,
	// Llama-3.1-8B's in fp16. Only the modelled restore times use it: the
	// simulated workers keep 4 bytes a token.
	TokenBytes int64
	// Profile is the workers' step times. Nil means sim.DefaultProfile.
	Profile *sim.Profile
	// MaxNumSeqs and MaxNumBatchedTokens are the workers' batch limits;
	// zero takes sched's defaults (256, 2048).
	MaxNumSeqs, MaxNumBatchedTokens int

	// DRAMTokens, SSDTokens and S3Tokens are the cache's capacities per
	// tier, in tokens, for the whole cluster. The defaults are 8 Mi
	// tokens (1 TiB at the default TokenBytes: 128 GiB of host DRAM on
	// each of 8 workers' hosts), 64 Mi tokens (8 TiB: one NVMe drive a
	// host) and 2^40 (unbounded).
	DRAMTokens, SSDTokens, S3Tokens int64
	// CachePolicy is the eviction policy of every tier, one of
	// tiers/policy.Names. The default, "", is the node's: each tier's
	// (tiers/policy.DefaultDRAM, DefaultSSD, DefaultS3).
	CachePolicy string
	// Tiers are the restore costs of DRAM, SSD and S3; a zero field takes
	// DefaultTiers' value. The routers are given the same figures.
	Tiers [3]TierModel
	// CacheTimeout bounds one onboarding, as the worker's
	// sched.Config.CacheTimeout: what has not been restored by then is
	// recomputed. The default is sched's, 500 ms.
	CacheTimeout time.Duration

	// Parallel is how many policies are simulated at once, each in its
	// own goroutine with its own workers, router and cache. The default
	// is 1; more needs that many times the memory.
	Parallel int

	// Progress, if set, is called as requests end: the policy replayed,
	// the requests ended so far and the total.
	Progress func(p policy.Policy, done, total int)

	// onWorker and onCandidates let the package's tests watch a run: a
	// worker changing state (at the virtual time), and the workers a
	// request's candidates are built from.
	onWorker     func(at time.Duration, name string, st workerState)
	onCandidates func(ws []*worker)
}

// ErrConfig marks a bad Config; test with errors.Is.
var ErrConfig = errors.New("simulate: bad config")

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if len(c.Policies) == 0 {
		c.Policies = []policy.Policy{policy.Random, policy.RoundRobin, policy.LeastLoaded, policy.KVHBM, policy.KVTiered}
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Vocab == 0 {
		c.Vocab = replay.DefaultVocab
	}
	if c.PoolTokens == 0 {
		c.PoolTokens = DefaultPoolTokens
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.TokenBytes == 0 {
		c.TokenBytes = DefaultTokenBytes
	}
	if c.Profile == nil {
		p := sim.DefaultProfile()
		c.Profile = &p
	}
	if c.DRAMTokens == 0 {
		c.DRAMTokens = DefaultDRAMTokens
	}
	if c.SSDTokens == 0 {
		c.SSDTokens = DefaultSSDTokens
	}
	if c.S3Tokens == 0 {
		c.S3Tokens = DefaultS3Tokens
	}
	def := DefaultTiers()
	for i := range c.Tiers {
		if c.Tiers[i].Bandwidth == 0 {
			c.Tiers[i].Bandwidth = def[i].Bandwidth
		}
		if c.Tiers[i].Latency == 0 {
			c.Tiers[i].Latency = def[i].Latency
		}
	}
	if c.CacheTimeout == 0 {
		c.CacheTimeout = sched.DefaultCacheTimeout
	}
	if c.Parallel == 0 {
		c.Parallel = 1
	}
	if c.ScaleInterval == 0 {
		c.ScaleInterval = DefaultScaleInterval
	}
	if c.StartupDelay == 0 { // a negative delay stays: none, and EnsureDefaults may run again
		c.StartupDelay = DefaultStartupDelay
	}
	if c.MinWorkers == 0 {
		c.MinWorkers = DefaultMinWorkers
	}
	if c.MaxWorkers == 0 {
		c.MaxWorkers = max(DefaultMaxWorkers, c.Workers)
	}
	if c.SLO.TTFT == 0 {
		c.SLO.TTFT = DefaultSLOTTFT
	}
	if c.SLO.TTFTSlack == 0 {
		c.SLO.TTFTSlack = DefaultSLOTTFTSlack
	}
	if c.SLO.ITL == 0 {
		c.SLO.ITL = DefaultSLOITL
	}
}

// tierNames are the cache tiers of Config.Tiers, in order.
var tierNames = [3]string{"dram", "ssd", "s3"}

// Validate reports every bad field of c at once, as an error matching
// ErrConfig. It expects EnsureDefaults to have run.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if c.Workers < 1 || c.Workers > 1024 {
		bad("workers is %d, must be in [1, 1024]", c.Workers)
	}
	seen := map[policy.Policy]bool{}
	for _, p := range c.Policies {
		if seen[p] {
			bad("policy %s is given twice", p)
		}
		seen[p] = true
	}
	seenBase := map[policy.Policy]bool{}
	for _, p := range c.Baselines {
		if seenBase[p] {
			bad("baseline %s is given twice", p)
		}
		seenBase[p] = true
	}
	if !(c.Speedup > 0) || c.Speedup > 1e9 {
		bad("speedup is %v, must be in (0, 1e9]", c.Speedup)
	}
	if c.Vocab < 1 {
		bad("vocab is %d, must be ≥ 1", c.Vocab)
	}
	if c.BlockTokens < 1 || c.BlockTokens > 1024 {
		bad("block tokens is %d, must be in [1, 1024]", c.BlockTokens)
	} else if c.PoolTokens < 2*c.BlockTokens {
		bad("pool tokens is %d, must hold at least two blocks of %d tokens", c.PoolTokens, c.BlockTokens)
	}
	if c.TokenBytes < 1 {
		bad("token bytes is %d, must be ≥ 1", c.TokenBytes)
	}
	if c.MaxNumSeqs < 0 || c.MaxNumBatchedTokens < 0 {
		bad("max num seqs %d and max num batched tokens %d must be ≥ 0", c.MaxNumSeqs, c.MaxNumBatchedTokens)
	}
	for i, n := range []int64{c.DRAMTokens, c.SSDTokens, c.S3Tokens} {
		if c.BlockTokens > 0 && n < int64(c.BlockTokens) {
			bad("%s capacity is %d tokens, must hold at least one block of %d tokens", tierNames[i], n, c.BlockTokens)
		}
	}
	if c.CachePolicy != "" && !tierpolicy.Valid(c.CachePolicy) {
		bad("cache policy %q is not one of %s", c.CachePolicy, strings.Join(tierpolicy.Names, ", "))
	}
	for i, t := range c.Tiers {
		if !(t.Bandwidth > 0) || math.IsInf(t.Bandwidth, 0) {
			bad("%s bandwidth is %v, must be > 0", tierNames[i], t.Bandwidth)
		}
		if t.Latency < 0 {
			bad("%s latency is %v, must be ≥ 0", tierNames[i], t.Latency)
		}
	}
	if c.Parallel < 1 {
		bad("parallel is %d, must be ≥ 1", c.Parallel)
	}
	if c.ScaleInterval < 0 {
		bad("scale interval is %v, must be > 0", c.ScaleInterval)
	}
	if c.MinWorkers < 1 || c.MaxWorkers < c.MinWorkers || c.MaxWorkers > 1024 {
		bad("min workers %d and max workers %d must satisfy 1 ≤ min ≤ max ≤ 1024", c.MinWorkers, c.MaxWorkers)
	}
	seenScaler := map[string]bool{}
	for _, s := range c.Scalers {
		if seenScaler[s.Name] {
			bad("scaler %q is given twice", s.Name)
		}
		seenScaler[s.Name] = true
		if s.Workers < 0 || s.Workers > 1024 {
			bad("scaler %q's workers is %d, must be in [0, 1024]", s.Name, s.Workers)
		}
		if s.New != nil && (s.Workers > c.MaxWorkers || s.Workers != 0 && s.Workers < c.MinWorkers) {
			bad("scaler %q starts with %d workers, outside [%d, %d]", s.Name, s.Workers, c.MinWorkers, c.MaxWorkers)
		}
	}
	if c.SLO.TTFT < 0 || c.SLO.ITL < 0 || !(c.SLO.TTFTSlack >= 0) {
		bad("SLO TTFT %v, TTFT slack %v and ITL %v must be ≥ 0", c.SLO.TTFT, c.SLO.TTFTSlack, c.SLO.ITL)
	}
	if c.CacheTimeout < 0 {
		bad("cache timeout is %v, must be > 0", c.CacheTimeout)
	}
	if c.Profile != nil {
		if err := c.Profile.Validate(); err != nil {
			bad("profile: %v", err)
		}
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrConfig, strings.Join(probs, "; "))
}

// blockBytes is one block's modelled bytes.
func (c *Config) blockBytes() int64 { return int64(c.BlockTokens) * c.TokenBytes }

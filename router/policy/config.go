package policy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
)

// Policy names a way of choosing a worker (see the package doc).
type Policy uint8

// The policies. The zero value stands for the default, KVTiered.
const (
	KVTiered Policy = iota
	KVHBM
	LeastLoaded
	Random
	RoundRobin
)

var policyNames = [...]string{KVTiered: "kv-tiered", KVHBM: "kv-hbm", LeastLoaded: "least-loaded", Random: "random", RoundRobin: "round-robin"}

// Policies lists every policy, the default first.
func Policies() []Policy { return []Policy{KVTiered, KVHBM, LeastLoaded, Random, RoundRobin} }

func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ErrUnknownPolicy marks a policy name ParsePolicy does not know.
var ErrUnknownPolicy = errors.New("policy: unknown policy")

// ParsePolicy is the inverse of Policy.String.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if n == s {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want one of %s)", ErrUnknownPolicy, s, strings.Join(policyNames[:], ", "))
}

// TieBreak says how Temperature 0 chooses among equally cheap candidates.
type TieBreak uint8

const (
	// TieRandom picks uniformly among them with the seeded generator.
	TieRandom TieBreak = iota
	// TieLowestIndex picks the first of them in the candidates' order.
	TieLowestIndex
)

// NumTiers is the number of cache tiers, index.TierHBM … index.TierS3.
const NumTiers = int(index.TierS3)

// TierCost is what restoring blocks from a cache tier into a worker's pool
// costs: Latency once per run of blocks, then BlockBytes / Bandwidth a block.
type TierCost struct {
	// Bandwidth is in bytes a second. Zero means the tier's default; a
	// negative value means the tier earns no credit.
	Bandwidth float64
	// Latency is the time to the first block of a run. Zero means the
	// tier's default; set a tiny positive value for none.
	Latency time.Duration
}

// DefaultTierCosts are the figures measured in docs/BENCHMARKS.md on the
// development machine (one host, loopback), per tier:
//
//	hbm:  2.8 GB/s, 30 µs  — the ucx data plane over shared memory, 1 MiB
//	                          blocks ("Data plane: UCX against ucx_perftest")
//	dram: 2.0 GB/s, 35 µs  — data-plane gets 1.6–2.5 GB/s; one 64 KiB get
//	                          31–37 µs ("Cache node: data plane against iperf3")
//	ssd:  0.9 GB/s, 180 µs — fio's random 1 MiB read of the disk, 887 MB/s;
//	                          a 4 KiB get from the SSD tier 176 µs ("Every tier")
//	s3:   0.9 GB/s, 10 ms  — a 1.2 GB restore through the node: first block
//	                          after 10 ms, 990 MB/s ("Object store:
//	                          long-context restore"); that store sat on the
//	                          same host's disk and page cache, and a remote
//	                          one is no faster than the local disk, so the
//	                          default takes the SSD's bandwidth
//
// Feed measured figures of the deployment through Config.Tiers.
func DefaultTierCosts() [NumTiers]TierCost {
	return [NumTiers]TierCost{
		{Bandwidth: 2.8e9, Latency: 30 * time.Microsecond},
		{Bandwidth: 2.0e9, Latency: 35 * time.Microsecond},
		{Bandwidth: 0.9e9, Latency: 180 * time.Microsecond},
		{Bandwidth: 0.9e9, Latency: 10 * time.Millisecond},
	}
}

// Config is a Router's settings. The zero value is valid: every field says
// its default.
type Config struct {
	// Policy is the default policy. The default is KVTiered.
	Policy Policy
	// BlockTokens is the block size in tokens. The default is 16.
	BlockTokens int
	// BlockBytes is the KV bytes of one block, all layers. The default is
	// 4096, the sim model's default layout (4 layers × 64 B a token × 16
	// tokens), matching the default Profile; a Llama-3-8B-shaped model has
	// 2 MiB blocks of 16 tokens.
	BlockBytes int64
	// Profile is the workers' step times; its Prefill curve (ms of x new
	// tokens) gives each block's recompute time. Nil means
	// sim.DefaultProfile(). A worker whose profile differs brings its own
	// (Candidate.Prefill).
	Profile *sim.Profile
	// Tiers is the restore cost of each cache tier, indexed by
	// index.TierKind − 1. Zero fields take DefaultTierCosts.
	Tiers [NumTiers]TierCost
	// OverlapWeight scales the prefill work against the decode load, in
	// blocks of decode load per block of prefill: higher favours time to
	// first token, lower inter-token latency. The default is 1. (To ignore
	// the overlap, use LeastLoaded.)
	OverlapWeight float64
	// Temperature is the softmax temperature, relative to the spread of
	// the costs; 0, the default, chooses the cheapest.
	Temperature float64
	// TieBreak breaks ties at Temperature 0. The default is TieRandom.
	TieBreak TieBreak
	// BusyBlockFraction: a worker whose active blocks reach this fraction
	// of its Capacity is busy. The default is 0.95; negative means never.
	BusyBlockFraction float64
	// BusyPrefillTokens: a worker with this many active prefill tokens is
	// busy. The default is 65536 (about 2.8 s of prefill on the default
	// profile); negative means never.
	BusyPrefillTokens int
	// Seed seeds the generator of random choices. The default is 0.
	Seed uint64
}

// ErrBadConfig marks a Config or an Override that fails Validate.
var ErrBadConfig = errors.New("policy: bad config")

// EnsureDefaults fills c's zero fields with their documented defaults.
func (c *Config) EnsureDefaults() {
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = 4096
	}
	if c.Profile == nil {
		p := sim.DefaultProfile()
		c.Profile = &p
	}
	def := DefaultTierCosts()
	for i := range c.Tiers {
		if c.Tiers[i].Bandwidth == 0 {
			c.Tiers[i].Bandwidth = def[i].Bandwidth
		}
		if c.Tiers[i].Latency == 0 {
			c.Tiers[i].Latency = def[i].Latency
		}
	}
	if c.OverlapWeight == 0 {
		c.OverlapWeight = 1
	}
	if c.BusyBlockFraction == 0 {
		c.BusyBlockFraction = 0.95
	}
	if c.BusyPrefillTokens == 0 {
		c.BusyPrefillTokens = 65536
	}
}

// Validate reports every problem of c, each naming its field, in one error
// wrapping ErrBadConfig, or nil. It expects EnsureDefaults to have run.
func (c *Config) Validate() error {
	var probs []string
	bad := func(f string, args ...any) { probs = append(probs, fmt.Sprintf(f, args...)) }
	if int(c.Policy) >= len(policyNames) {
		bad("policy is %d, not a known policy", c.Policy)
	}
	if c.BlockTokens < 1 || c.BlockTokens > index.MaxBlockTokens {
		bad("block tokens is %d, must be in [1, %d]", c.BlockTokens, index.MaxBlockTokens)
	}
	if c.BlockBytes < 1 {
		bad("block bytes is %d, must be positive", c.BlockBytes)
	}
	if c.Profile != nil {
		if err := c.Profile.Validate(); err != nil {
			bad("profile: %v", err)
		}
	}
	for i, t := range c.Tiers {
		name := index.TierKind(i + 1).String()
		if math.IsNaN(t.Bandwidth) || math.IsInf(t.Bandwidth, 0) {
			bad("tiers[%s].bandwidth is %v, must be finite", name, t.Bandwidth)
		}
		if t.Latency < 0 {
			bad("tiers[%s].latency is %v, must not be negative", name, t.Latency)
		}
	}
	probs = checkKnobs(probs, c.OverlapWeight, c.Temperature, c.BusyBlockFraction)
	if c.TieBreak > TieLowestIndex {
		bad("tie break is %d, must be TieRandom or TieLowestIndex", c.TieBreak)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

func checkKnobs(probs []string, weight, temp, busy float64) []string {
	if !(weight > 0) || math.IsInf(weight, 0) {
		probs = append(probs, fmt.Sprintf("overlap weight is %v, must be positive and finite", weight))
	}
	if !(temp >= 0) || math.IsInf(temp, 0) {
		probs = append(probs, fmt.Sprintf("temperature is %v, must be ≥ 0 and finite", temp))
	}
	if math.IsNaN(busy) || math.IsInf(busy, 0) {
		probs = append(probs, fmt.Sprintf("busy block fraction is %v, must be finite", busy))
	}
	return probs
}

// Override changes a Router's settings for one request; nil fields keep
// the Router's.
type Override struct {
	Policy            *Policy
	OverlapWeight     *float64
	Temperature       *float64
	BusyBlockFraction *float64
	BusyPrefillTokens *int
}

// knobs are the settings one decision uses.
type knobs struct {
	policy      Policy
	weight      float64
	temperature float64
	busyFrac    float64
	busyPrefill int
}

func (c *Config) knobs(o *Override) (knobs, error) {
	k := knobs{c.Policy, c.OverlapWeight, c.Temperature, c.BusyBlockFraction, c.BusyPrefillTokens}
	if o == nil {
		return k, nil
	}
	if o.Policy != nil {
		k.policy = *o.Policy
	}
	if o.OverlapWeight != nil {
		k.weight = *o.OverlapWeight
	}
	if o.Temperature != nil {
		k.temperature = *o.Temperature
	}
	if o.BusyBlockFraction != nil {
		k.busyFrac = *o.BusyBlockFraction
	}
	if o.BusyPrefillTokens != nil {
		k.busyPrefill = *o.BusyPrefillTokens
	}
	probs := checkKnobs(nil, k.weight, k.temperature, k.busyFrac)
	if int(k.policy) >= len(policyNames) {
		probs = append(probs, fmt.Sprintf("policy is %d, not a known policy", k.policy))
	}
	if len(probs) > 0 {
		return k, fmt.Errorf("%w: override: %s", ErrBadConfig, strings.Join(probs, "; "))
	}
	return k, nil
}

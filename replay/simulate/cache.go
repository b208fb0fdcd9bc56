package simulate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	tierpolicy "github.com/kvstrata/kvstrata/tiers/policy"
	tiersim "github.com/kvstrata/kvstrata/tiers/sim"
)

// cache is the modelled kvstrata cluster: the node's real tiers.Hierarchy
// (placement in DRAM, demotion of victims to the SSD and on to S3,
// promotion of hits, the eviction policy) over tiers that keep a block's
// header and no bytes, each block one byte, so capacities count blocks.
// Restore times are modelled per tier (TierModel).
type cache struct {
	h          *tiers.Hierarchy
	kinds      [3]index.TierKind
	models     [3]TierModel
	blockBytes int64
	bt         int
	timeout    time.Duration

	// hitTokens counts the tokens restored from each tier (Config.Tiers'
	// order); offloaded the blocks stored, duplicates the blocks offloaded
	// that the cache already held, rejected those it had no room for.
	hitTokens                       [3]int64
	offloaded, duplicates, rejected int64
	timeouts                        int64
}

// unit is the one byte every modelled block holds.
var (
	unit    = []byte{0}
	unitSum = index.Checksum(unit)
)

func newCache(cfg *Config) (*cache, error) {
	c := &cache{
		kinds:      [3]index.TierKind{index.TierDRAM, index.TierSSD, index.TierS3},
		models:     cfg.Tiers,
		blockBytes: cfg.blockBytes(),
		bt:         cfg.BlockTokens,
		timeout:    cfg.CacheTimeout,
	}
	var levels []tiers.LevelConfig
	names := [3]string{tierpolicy.DefaultDRAM, tierpolicy.DefaultSSD, tierpolicy.DefaultS3}
	if cfg.CachePolicy != "" {
		names = [3]string{cfg.CachePolicy, cfg.CachePolicy, cfg.CachePolicy}
	}
	for i, tokens := range []int64{cfg.DRAMTokens, cfg.SSDTokens, cfg.S3Tokens} {
		p, err := tierpolicy.New(names[i])
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		levels = append(levels, tiers.LevelConfig{
			Kind: c.kinds[i], Tier: tiersim.NewGhostTier(tokens / int64(cfg.BlockTokens)), Policy: p,
			HighWatermark: 1, LowWatermark: 1,
		})
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: levels})
	if err != nil {
		return nil, fmt.Errorf("simulate: the cache's hierarchy: %w", err)
	}
	c.h = h
	return c, nil
}

func (c *cache) close() { _ = c.h.Close() }

// tier is the position of kind in Config.Tiers, -1 if none.
func (c *cache) tier(kind index.TierKind) int {
	for i, k := range c.kinds {
		if k == kind {
			return i
		}
	}
	return -1
}

// where returns the fastest tier of each leading block of hashes the cache
// holds, as a cluster Lookup tells the frontend; no access is counted.
func (c *cache) where(ns index.NamespaceID, hashes []index.Hash) []index.TierKind {
	var out []index.TierKind
	for _, h := range hashes {
		_, kind, err := c.h.Stat(index.Key{NS: ns, Hash: h})
		if err != nil {
			break
		}
		out = append(out, kind)
	}
	return out
}

// offload stores the blocks the cache does not hold yet, instantly: a
// worker's offload is write-behind and costs it no step time.
func (c *cache) offload(ns index.NamespaceID, blocks []sched.Block) {
	for _, b := range blocks {
		if c.h.Lookup(ns, []index.Hash{b.Hash}).Blocks == 1 {
			c.duplicates++
			continue
		}
		k := index.Key{NS: ns, Hash: b.Hash}
		m := index.Header{Key: k, Sum: unitSum}
		m.Size = 1
		m.Parent, m.HasParent = b.Parent, b.HasParent
		switch err := c.h.Put(m, unit); {
		case err == nil:
			c.offloaded++
		case errors.Is(err, tiers.ErrFull):
			c.rejected++
		default:
			panic(fmt.Sprintf("simulate: the cache refused a block: %v", err)) // a bug of the model, not an outcome
		}
	}
}

// connector is one worker's way to the modelled cache: sched's Connector,
// called inline by the driven engine, its restores charged to the worker's
// virtual clock.
type connector struct {
	c     *cache
	clock *sim.VirtualClock
}

var _ sched.Connector = connector{}

func (w connector) Lookup(_ context.Context, ns index.NamespaceID, hashes []index.Hash) (int, error) {
	return w.c.h.Lookup(ns, hashes).Blocks, nil
}

// Load restores the leading blocks of hashes the cache holds, each from its
// fastest tier (a hit below DRAM is promoted, by the hierarchy), and
// sleeps the modelled time on the worker's clock: per run of blocks from
// one tier, its latency, then each block's bytes at its bandwidth. What
// would end after the cache timeout is not loaded (the engine recomputes
// it), and the worker waits out the timeout, as a real one would.
func (w connector) Load(ctx context.Context, _ string, ns index.NamespaceID, hashes []index.Hash, _ func(int) []byte) (int, error) {
	c := w.c
	var took time.Duration
	prev := -1
	n := 0
	for _, h := range hashes {
		_, _, kind, err := c.h.Get(index.Key{NS: ns, Hash: h}, nil)
		t := c.tier(kind)
		if err != nil || t < 0 {
			break
		}
		d := c.models[t].Time(1, c.blockBytes)
		if t == prev {
			d -= c.models[t].Latency
		}
		if took+d > c.timeout {
			c.timeouts++
			took = c.timeout
			break
		}
		took += d
		prev = t
		c.hitTokens[t] += int64(c.bt)
		n++
	}
	// The engine's ctx carries its cache timeout in wall time, which has
	// nothing to do with the modelled time: the timeout is applied above,
	// in virtual time, and a loaded machine must not change the outcome.
	if err := w.clock.Sleep(context.WithoutCancel(ctx), took); err != nil {
		return 0, err
	}
	return n, nil
}

func (w connector) Offload(ns index.NamespaceID, blocks []sched.Block) { w.c.offload(ns, blocks) }

// Store is disaggregated prefill's write-through, which the simulated
// replay does not run.
func (w connector) Store(context.Context, string, index.NamespaceID, []sched.Block) (string, error) {
	return "", errors.New("simulate: no disaggregated serving in the simulated replay")
}

package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// MultiTier is a DRAM tier over an SSD tier, replayed through the node's
// real tiers.Hierarchy (demotion of DRAM victims, admission to the SSD,
// promotion of SSD hits, pins) over tiers that keep no bytes. A request's
// blocks are pinned while it is stored, which is how the hierarchy keeps
// them from being evicted to make room for the same request.
type MultiTier struct {
	Policy     string // DRAM and SSD policy: one of policy.Names
	DRAMTokens int64  // > 0
	SSDTokens  int64  // > 0
	// AdmitMinSeen admits a DRAM victim to the SSD only if it was accessed
	// this often lately; 0 or 1 admits all.
	AdmitMinSeen int
	// AdmitByFrequency admits a DRAM victim to a full SSD only if it was
	// seen more often than the SSD's own next victim (TinyLFU admission,
	// tiers.LevelConfig.AdmitByFrequency); AdmitMinSeen is then unused.
	AdmitByFrequency bool
	// SSDPolicy, when set, is the SSD's policy (one of policy.Names), and
	// Policy the DRAM's only.
	SSDPolicy string
}

var _ Spec = MultiTier{}

func (s MultiTier) String() string {
	pol := s.Policy
	if s.SSDPolicy != "" {
		pol += "/" + s.SSDPolicy
	}
	if s.AdmitByFrequency {
		return fmt.Sprintf("%s@dram=%d,ssd=%d,admit=frequency", pol, s.DRAMTokens, s.SSDTokens)
	}
	return fmt.Sprintf("%s@dram=%d,ssd=%d,admit=%d", pol, s.DRAMTokens, s.SSDTokens, max(s.AdmitMinSeen, 1))
}

// ssdPolicy is the SSD's policy name.
func (s MultiTier) ssdPolicy() string {
	if s.SSDPolicy != "" {
		return s.SSDPolicy
	}
	return s.Policy
}

// Validate reports every problem with s for blocks of blockTokens tokens.
func (s MultiTier) Validate(blockTokens int) error {
	var probs []string
	if !policy.Valid(s.Policy) {
		probs = append(probs, fmt.Sprintf("unknown policy %q for a multi-tier replay (want one of %s)", s.Policy, strings.Join(policy.Names, ", ")))
	}
	if s.SSDPolicy != "" && !policy.Valid(s.SSDPolicy) {
		probs = append(probs, fmt.Sprintf("unknown SSD policy %q (want one of %s)", s.SSDPolicy, strings.Join(policy.Names, ", ")))
	}
	for _, c := range []struct {
		name   string
		tokens int64
	}{{"dram", s.DRAMTokens}, {"ssd", s.SSDTokens}} {
		if c.tokens <= 0 || (blockTokens > 0 && c.tokens/int64(blockTokens) == 0) {
			probs = append(probs, fmt.Sprintf("%s capacity of %d tokens holds no block of %d tokens", c.name, c.tokens, blockTokens))
		}
	}
	if s.AdmitMinSeen < 0 || s.AdmitMinSeen > 15 {
		probs = append(probs, fmt.Sprintf("admit-min-seen %d outside [0, 15]", s.AdmitMinSeen))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("sim: %s: %s", s, strings.Join(probs, "; "))
}

func (s MultiTier) newCache(w *Workload) (cache, error) {
	if err := s.Validate(w.blockTokens); err != nil {
		return nil, err
	}
	var levels []tiers.LevelConfig
	for _, l := range []struct {
		kind   index.TierKind
		tokens int64
		admit  int
		byFreq bool
		policy string
	}{{index.TierDRAM, s.DRAMTokens, 1, false, s.Policy}, {index.TierSSD, s.SSDTokens, max(s.AdmitMinSeen, 1), s.AdmitByFrequency, s.ssdPolicy()}} {
		p, _ := policy.New(l.policy) // validated above
		levels = append(levels, tiers.LevelConfig{
			Kind: l.kind, Tier: newGhost(l.tokens / int64(w.blockTokens)), Policy: p,
			HighWatermark: 1, LowWatermark: 1, AdmitMinSeen: l.admit, AdmitByFrequency: l.byFreq,
		})
	}
	h, err := tiers.New(tiers.Config{Inline: true, Levels: levels, MaxLease: time.Hour})
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", s, err)
	}
	return &multiTier{h: h, blockTokens: int64(w.blockTokens),
		capacity: (s.DRAMTokens + s.SSDTokens) / int64(w.blockTokens)}, nil
}

// unit is the one byte every simulated block holds: capacities are in
// blocks.
var (
	unit    = []byte{0}
	unitSum = index.Checksum(unit)
)

type multiTier struct {
	h           *tiers.Hierarchy
	blockTokens int64
	capacity    int64
	// servedBy counts, per tier, the leading hit blocks it served.
	servedBy           map[index.TierKind]int64
	inserted, rejected int64
}

func (c *multiTier) lookup(keys []index.Key) int {
	if c.servedBy == nil {
		c.servedBy = map[index.TierKind]int64{}
	}
	chain := make([]index.Hash, len(keys))
	for i, k := range keys {
		chain[i] = k.Hash
	}
	hits := c.h.Lookup(Namespace, chain).Blocks
	for _, k := range keys[:hits] {
		if _, kind, err := c.h.Stat(k); err == nil {
			c.servedBy[kind]++
		}
	}
	return hits
}

func (c *multiTier) store(keys []index.Key, first int) {
	lease, err := c.h.Pin(keys, time.Hour)
	if err != nil {
		panic(fmt.Sprintf("sim: pin: %v", err)) // the hierarchy is open and the ttl valid
	}
	defer lease.Release()
	for i, k := range keys {
		if _, _, _, err := c.h.Get(k, nil); err == nil {
			continue
		}
		m := index.Header{Key: k, Sum: unitSum}
		m.Size = 1
		if i > 0 {
			m.Parent, m.HasParent = keys[i-1].Hash, true
		}
		switch err := c.h.Put(m, unit); {
		case err == nil:
			c.inserted++
		case errors.Is(err, tiers.ErrFull):
			c.rejected++
		default:
			panic(fmt.Sprintf("sim: put: %v", err))
		}
	}
}

func (c *multiTier) finish(r *Result) {
	s := c.h.Stats()
	r.CapacityBlocks = c.capacity
	r.Inserted, r.Rejected = c.inserted, c.rejected
	for _, l := range s.Levels {
		r.Tiers = append(r.Tiers, TierResult{
			Tier: l.Kind.String(), HitBlocks: c.servedBy[l.Kind], CapacityBlocks: l.Capacity,
			Evictions: l.Evictions, Demotions: l.Demotions, Promotions: l.Promotions,
		})
	}
	for _, l := range s.Levels {
		r.Evicted += l.Drops // blocks the hierarchy lost, from whichever tier
	}
	_ = c.h.Close()
}

// TierResult is one tier's share of a multi-tier replay.
type TierResult struct {
	Tier           string
	CapacityBlocks int64
	HitBlocks      int64 // leading hit blocks this tier served
	Evictions      int64
	Demotions      int64 // blocks it received from the tier above
	Promotions     int64 // blocks it received from below
}

// BlockHitRate returns the tier's hit blocks over all block references.
func (t TierResult) BlockHitRate(r Result) float64 { return ratio(t.HitBlocks, r.Blocks) }

// ghost is a tier that keeps every block's Meta and no bytes: capacities in
// the simulator count blocks of one byte.
type ghost struct {
	mu       sync.Mutex
	capacity int64
	blocks   map[index.Key]ghostMeta
	used     int64
}

// ghostMeta is a block's header without its key, which is the map's: a
// simulation holds millions of blocks, and a map slot of 40 bytes instead
// of 64 (key and header) is about a tenth less of what a hierarchy over
// ghost tiers keeps per block.
type ghostMeta struct {
	parent    index.Hash
	sum       uint64
	size      uint32
	hasParent bool
}

func (m ghostMeta) header(key index.Key) index.Header {
	h := index.Header{Key: key, Sum: m.sum}
	h.Parent, h.HasParent, h.Size = m.parent, m.hasParent, m.size
	return h
}

// NewGhostTier returns a tier that keeps every block's header and no bytes,
// holding up to capacity bytes of values: the simulators store blocks of
// one byte (Size 1), so that capacities count blocks, and replay through
// the node's real tiers.Hierarchy without the memory of real KV.
func NewGhostTier(capacity int64) tiers.Tier { return newGhost(capacity) }

func newGhost(capacity int64) *ghost {
	return &ghost{capacity: capacity, blocks: map[index.Key]ghostMeta{}}
}

func (g *ghost) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, g.capacity); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.blocks[m.Key]
	if g.used-int64(old.size)+int64(m.Size) > g.capacity {
		return tiers.ErrFull
	}
	g.used += int64(m.Size) - int64(old.size)
	g.blocks[m.Key] = ghostMeta{parent: m.Parent, sum: m.Sum, size: m.Size, hasParent: m.HasParent}
	return nil
}

func (g *ghost) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	m, err := g.Stat(key)
	if err != nil {
		return dst, m, err
	}
	return append(dst, slices.Repeat(unit, int(m.Size))...), m, nil
}

func (g *ghost) Stat(key index.Key) (index.Header, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.blocks[key]
	if !ok {
		return index.Header{}, tiers.ErrNotFound
	}
	return m.header(key), nil
}

func (g *ghost) Delete(key index.Key) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.blocks[key]
	if !ok {
		return tiers.ErrNotFound
	}
	g.used -= int64(m.size)
	delete(g.blocks, key)
	return nil
}

func (g *ghost) Scan(fn func(index.Header) bool) error { return nil } // starts empty

func (g *ghost) Stats() tiers.Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return tiers.Stats{Capacity: g.capacity, Used: g.used, Blocks: int64(len(g.blocks))}
}

func (g *ghost) Close() error { return nil }

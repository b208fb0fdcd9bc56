package tiers

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// LevelConfig configures one level of a Hierarchy.
type LevelConfig struct {
	Kind index.TierKind // which storage level this is (dram, ssd, …)
	Tier Tier
	// Policy orders the level's blocks for eviction. The default is LRU.
	Policy policy.Policy
	// HighWatermark is the fraction of capacity above which the background
	// mover starts demoting victims, and LowWatermark the fraction it
	// demotes down to. Puts that find no room reclaim space themselves.
	// The defaults are 0.95, and 0.85 or HighWatermark if that is lower.
	HighWatermark, LowWatermark float64
	// AdmitMinSeen admits a victim from the level above into this level
	// only if its key was accessed at least this many times lately (a
	// frequency sketch remembers keys after they leave the cache). 2 keeps
	// one-hit wonders off an SSD. The default, 1, admits every victim.
	AdmitMinSeen int
	// AdmitByFrequency replaces AdmitMinSeen's fixed threshold with
	// TinyLFU's admission: once this level is above its high watermark, a
	// victim from the level above is admitted only if the frequency sketch
	// has seen it more often than this level's own next victim, the block
	// it would displace. Below the watermark every victim is admitted.
	AdmitByFrequency bool
	// Shared marks a tier every node of a cluster reads (an object store):
	// its copies are published at index.AnyNode rather than this node, and
	// a key the hierarchy does not know is looked for there on a miss.
	Shared bool
	// PromoteInto lists the kinds of the faster levels a hit on this level
	// is copied into (an object store's hits into the SSD, DRAM or both).
	// Empty means the fastest level.
	PromoteInto []index.TierKind
}

// Config configures a Hierarchy.
type Config struct {
	// Node is this node's id in the locations the hierarchy publishes. The
	// default is 1.
	Node index.NodeID
	// Levels lists the tiers, fastest first; at least one, at most 8.
	Levels []LevelConfig
	// NoPromote turns off copying lower-level hits into level 0. The
	// default (false) promotes them.
	NoPromote bool
	// MaxLease caps the lease of a pin. The default is 5 minutes.
	MaxLease time.Duration
	// Inline runs demotion and promotion in the calling goroutine instead
	// of a background mover: deterministic, for simulation and tests.
	Inline bool
	// OnChange, if set, is told every change of where the hierarchy holds
	// its blocks, in order: a copy stored at a level's location, or
	// removed. A cluster node publishes them to the replicated directory;
	// an index.Directory mirrors them with OnChange: dir.Apply. It is called
	// under the hierarchy's lock: it must be quick and must not call back
	// into the hierarchy. The default (nil) tells no one.
	OnChange func(index.Change)
	// Tenants says the blocks' namespaces are bound to tenants
	// (index.BindTenant, on a node that authenticates its clients): each
	// level then counts its bytes and blocks per tenant tag (Stats) and
	// enforces the quotas SetQuotas sets. The default (false) counts
	// nothing per tenant: unbound namespaces carry no tenant.
	Tenants bool
}

// ErrPinned is returned by Delete for a block under an unexpired pin.
var ErrPinned = errors.New("tiers: block pinned")

// EnsureDefaults sets every zero field of c, and of each of its levels, to
// its default. It leaves bad values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.Node == 0 {
		c.Node = 1
	}
	if c.MaxLease == 0 {
		c.MaxLease = 5 * time.Minute
	}
	for i := range c.Levels {
		l := &c.Levels[i]
		if l.Policy == nil {
			l.Policy = policy.NewLRU()
		}
		if l.HighWatermark == 0 {
			l.HighWatermark = 0.95
		}
		if l.LowWatermark == 0 {
			l.LowWatermark = min(0.85, l.HighWatermark)
		}
		if l.AdmitMinSeen == 0 {
			l.AdmitMinSeen = 1
		}
	}
}

// Validate reports every problem with c in one error that wraps
// ErrInvalidConfig, or returns nil. Call it after EnsureDefaults: it
// reports the zero value of a field that has a default as out of range.
func (c *Config) Validate() error {
	var probs []string
	if len(c.Levels) == 0 {
		probs = append(probs, "no levels")
	}
	if len(c.Levels) > 8 {
		probs = append(probs, fmt.Sprintf("%d levels, at most 8", len(c.Levels)))
	}
	if c.Node == index.AnyNode {
		probs = append(probs, "node 0 is index.AnyNode, not a node")
	}
	if c.MaxLease <= 0 {
		probs = append(probs, fmt.Sprintf("max lease %v is not positive", c.MaxLease))
	}
	seen := map[index.TierKind]bool{}
	for i, l := range c.Levels {
		name := fmt.Sprintf("level %d (%v)", i, l.Kind)
		for _, k := range l.PromoteInto {
			if !seen[k] {
				probs = append(probs, fmt.Sprintf("%s: promotes into %v, which is not a faster level", name, k))
			}
		}
		if l.Tier == nil {
			probs = append(probs, name+": no tier")
		}
		if l.Policy == nil {
			probs = append(probs, name+": no policy")
		}
		if l.Kind.String() == fmt.Sprintf("tier(%d)", uint8(l.Kind)) {
			probs = append(probs, name+": unknown tier kind")
		} else if seen[l.Kind] {
			probs = append(probs, name+": kind used twice")
		}
		seen[l.Kind] = true
		if l.HighWatermark <= 0 || l.HighWatermark > 1 {
			probs = append(probs, fmt.Sprintf("%s: high watermark %v outside (0, 1]", name, l.HighWatermark))
		}
		if l.LowWatermark <= 0 || l.LowWatermark > l.HighWatermark {
			probs = append(probs, fmt.Sprintf("%s: low watermark %v outside (0, high watermark]", name, l.LowWatermark))
		}
		if l.AdmitMinSeen < 1 || l.AdmitMinSeen > 15 {
			probs = append(probs, fmt.Sprintf("%s: admit-min-seen %d outside [1, 15]", name, l.AdmitMinSeen))
		}
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: hierarchy: %s", ErrInvalidConfig, strings.Join(probs, "; "))
}

// Hierarchy stacks tiers into one node-local cache. A Put lands in level 0;
// when a level passes its high watermark its policy picks victims, which are
// demoted to the next level (if admitted there and not already held there)
// or dropped. A hit in a lower level is returned at once and copied up to
// level 0 (promotion) by the mover; the lower copy stays, so evicting the
// promoted block later costs no write. A pinned block may be demoted but is
// never dropped: the node keeps it until the lease ends.
//
// Every method is safe for concurrent use. Block bytes move outside the
// hierarchy's lock; one writer at a time owns a key (Put, Delete or a move),
// so the levels never hold two versions of a key that the hierarchy thinks
// are the same. A read of one block (Get, View, ViewDevice, a ReadMany of
// one key) finds its level in the read index (readIndex), not under the
// lock, and records its hit for the policies in a buffer that the next
// holder of the lock applies first (touches): reads wait neither for each
// other nor for writers. Stat, Lookup, Stats and the lookups of a ReadMany
// hold the lock shared.
type Hierarchy struct {
	node   index.NodeID
	levels []*level
	cfg    Config

	// mu guards the entries, pins, policies, sketch and counters. Hold it
	// exclusively with lock, which applies the buffered hits first.
	mu       sync.RWMutex
	reads    touches   // hits recorded without mu held exclusively
	readable readIndex // what a read needs of entries, without mu
	entries  map[index.Key]*entry
	pins     map[index.Key]*pin
	pinCalls int
	sketch   *policy.Sketch // nil when every level admits everything
	closed   atomic.Bool
	// gets and misses count as LevelStats' hits do, without the lock.
	gets, misses atomic.Int64
	// overQuota is set when a tenant may be over a quota (SetQuotas ran)
	// and cleared by the trim that brings every tenant back under.
	overQuota atomic.Bool
	quotas    atomic.Int32 // how many (tenant, level) quotas SetQuotas set

	kick     chan struct{}
	promoteQ chan promotion
	queued   atomic.Int64 // bytes of data held by the promotions in promoteQ
	settle   chan chan struct{}
	stop     chan struct{}
	mover    sync.WaitGroup
}

type level struct {
	LevelConfig
	loc                                     index.Location
	promoteInto                             []int // faster levels its hits are copied into
	evictions, demotions, promotions, drops int64
	// hits and unreachable (gets of its blocks while it could not be
	// reached) are counted without the hierarchy's lock, which a read need
	// not take again once it has its block.
	hits, unreachable atomic.Int64
	quotaEvictions    int64                      // evictions of a tenant's blocks within its quota
	shares            map[index.TenantTag]*share // with Config.Tenants
}

// entry is the hierarchy's record of one key.
type entry struct {
	meta index.Header
	in   uint8 // bit i: level i holds this version
	busy bool  // a writer owns the key
	// idle, when not nil, is closed when the key's owner lets go of it:
	// made by the first goroutine that waits for that, so that a release
	// wakes only the waiters of its own key.
	idle chan struct{}
	// holdIn is 1 + the level where the key's owner holds hold bytes of
	// its tenant's quota for a copy it is storing; 0 when it holds none.
	holdIn uint8
	hold   uint32
	// atime is the unix nanoseconds of the last Put or Get, which a read
	// sets without the lock held exclusively.
	atime atomic.Int64
}

type promotion struct {
	key  index.Key
	from int
	// data, when set, holds the block's bytes as a reader just got them
	// (read-only, shared), so the promotion need not read them again.
	data []byte
	// ref, when set, is the promotion's own reference on the pooled
	// buffer holding data, released once the promotion is done with it.
	ref  *bufpool.Buffer
	meta index.Header
}

// New stacks cfg.Levels and loads what persistent levels already hold. It
// works on a copy of cfg, levels included, with defaults applied
// (EnsureDefaults), and fails with an error wrapping ErrInvalidConfig if
// the copy does not Validate.
func New(cfg Config) (*Hierarchy, error) {
	cfg.Levels = slices.Clone(cfg.Levels) // EnsureDefaults sets their fields
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Hierarchy{
		node:     cfg.Node,
		cfg:      cfg,
		entries:  make(map[index.Key]*entry),
		pins:     make(map[index.Key]*pin),
		kick:     make(chan struct{}, 1),
		promoteQ: make(chan promotion, 256),
		settle:   make(chan chan struct{}),
		stop:     make(chan struct{}),
	}
	for _, lc := range cfg.Levels {
		loc := index.Location{Node: cfg.Node, Tier: lc.Kind}
		if lc.Shared {
			loc.Node = index.AnyNode
		}
		l := &level{LevelConfig: lc, loc: loc}
		if cfg.Tenants {
			l.shares = make(map[index.TenantTag]*share)
		}
		for _, k := range lc.PromoteInto {
			l.promoteInto = append(l.promoteInto, slices.IndexFunc(h.levels, func(u *level) bool { return u.Kind == k }))
		}
		if len(h.levels) > 0 && len(l.promoteInto) == 0 {
			l.promoteInto = []int{0}
		}
		slices.Sort(l.promoteInto)
		l.promoteInto = slices.Compact(l.promoteInto)
		h.levels = append(h.levels, l)
		if (lc.AdmitMinSeen > 1 || lc.AdmitByFrequency) && h.sketch == nil {
			h.sketch = policy.NewSketch(1 << 16)
		}
	}
	h.pinHostArenas()
	if err := h.load(); err != nil {
		return nil, err
	}
	if !cfg.Inline {
		h.mover.Add(1)
		go h.run()
	}
	return h, nil
}

// pinHostArenas registers every host-memory level's arena with every
// device level, so that demotion and promotion between them run as DMA. A
// region that cannot be pinned is left to the driver's staged copies; the
// device level's Detail says how much host memory it pinned.
func (h *Hierarchy) pinHostArenas() {
	for _, d := range h.levels {
		p, ok := d.Tier.(HostPinner)
		if !ok {
			continue
		}
		for _, l := range h.levels {
			if a, ok := l.Tier.(HostArena); ok {
				_ = p.PinHost(a.HostArena())
			}
		}
	}
}

// load registers the blocks the levels already hold, fastest level first.
// A slower level's copy of a key counts only if it is the same version.
func (h *Hierarchy) load() error {
	now := time.Now().UnixNano()
	for i, l := range h.levels {
		err := l.Tier.Scan(func(m index.Header) bool {
			if e := h.entries[m.Key]; e != nil {
				if e.meta.Sum != m.Sum || e.meta.Size != m.Size {
					return true // stale copy; replaced when the key is next demoted
				}
				e.in |= 1 << i
			} else {
				e := &entry{meta: m, in: 1 << i}
				e.atime.Store(now)
				h.entries[m.Key] = e
			}
			h.publishLocked(m.Key)
			h.chargeLocked(i, m, 1)
			h.addedLocked(i, m)
			return true
		})
		if err != nil {
			return fmt.Errorf("hierarchy: load %v: %w", l.Kind, err)
		}
	}
	return nil
}

// Node returns the node id of the hierarchy's locations.
func (h *Hierarchy) Node() index.NodeID { return h.node }

// Put stores a block in level 0, replacing any version of m.Key in any
// level. m.Sum must be index.Checksum(value). If level 0 has no room, Put evicts
// unpinned victims itself; it fails with ErrFull only when everything in
// level 0 is pinned or busy. When Put returns nil, no older version in a
// level that implements Invalidator can be read after a crash.
func (h *Hierarchy) Put(m index.Header, value []byte) error {
	if err := CheckPut(m, value, int64(^uint32(0))); err != nil {
		return err
	}
	e, err := h.acquire(m.Key, true)
	if err != nil {
		return err
	}
	return h.stored(e, m, h.store(0, m, value))
}

// stored finishes a Put of m into level 0 by the owner of m.Key: on success
// it records the new version and deletes older versions from the other
// levels, durably where a level's deletes are not (Invalidator), so that
// a crash after the Put returns cannot bring one back; either way it
// releases the key. It returns err, or why an older copy could not be
// invalidated.
//
// A copy below of the same version — the same checksum and Meta, as
// everywhere in the hierarchy — is not an older one: it stays.
//
// A Put takes the hierarchy's lock three times at most (acquire, here,
// and once more to record the older copies gone and release the key when
// there were any), twice when nothing below holds an older copy.
func (h *Hierarchy) stored(e *entry, m index.Header, err error) error {
	if err != nil {
		h.release(m.Key, e)
		return err
	}
	resurrect := h.mayResurrect(m.Key)
	h.lock()
	stale := e.in &^ 1 // level 0's copy was replaced in place
	if e.meta.Meta == m.Meta && e.meta.Sum == m.Sum {
		// The copies below hold these very bytes (a block put again, as a
		// KV block of a shared prefix is): they stay, unless their level
		// may bring back an older copy, whose invalidation takes this
		// one too.
		stale &= resurrect
	}
	h.touchLocked(m.Key, e)
	h.setLocked(e, m, 0)
	if stale|resurrect == 0 { // no level below holds or may bring back an older version
		h.releaseLocked(m.Key, e)
		h.mu.Unlock()
		h.checkWatermark(0)
		return nil
	}
	h.mu.Unlock()
	var errs []error
	for i := 1; i < len(h.levels); i++ {
		if (stale|resurrect)&(1<<i) == 0 {
			continue
		}
		if err := h.invalidate(i, m.Key); err != nil {
			errs = append(errs, err)
		}
	}
	h.lock()
	for i := 1; i < len(h.levels); i++ {
		if stale&(1<<i) != 0 {
			h.removedLocked(i, e, m.Key)
		}
	}
	h.releaseLocked(m.Key, e)
	h.mu.Unlock()
	h.checkWatermark(0)
	return errors.Join(errs...)
}

// mayResurrect returns the levels below level 0 whose tier may bring back
// a copy of key deleted earlier, or holds one the hierarchy may not know
// of (Invalidator.MayResurrect). It takes no lock of the hierarchy's: the
// caller owns key, so no other writer deletes a copy of it meanwhile, and
// a tier's answer only turns false as its deletes become durable.
func (h *Hierarchy) mayResurrect(key index.Key) uint8 {
	var levels uint8
	for i := 1; i < len(h.levels); i++ {
		if inv, ok := h.levels[i].Tier.(Invalidator); ok && inv.MayResurrect(key) {
			levels |= 1 << i
		}
	}
	return levels
}

// invalidate deletes level i's copy of an older version of key, which the
// caller owns and has just replaced in level 0, and makes sure that a copy
// the level deleted earlier cannot come back: a level whose tier is an
// Invalidator returns only once neither can be read after a crash; the
// others delete the copy as usual. The caller records the level's copy
// gone (removedLocked) afterwards, if the hierarchy recorded one.
func (h *Hierarchy) invalidate(i int, key index.Key) error {
	inv, ok := h.levels[i].Tier.(Invalidator)
	if !ok {
		_ = h.levels[i].Tier.Delete(key) // ErrNotFound: already gone, which is the goal
		return nil
	}
	if err := inv.Invalidate(key); err != nil {
		return fmt.Errorf("hierarchy: invalidate the older copy of %v in %v: %w", key, h.levels[i].Kind, err)
	}
	return nil
}

// Get appends a block's bytes to dst and returns them with the block's Meta
// and the kind of tier that served it. A copy that fails its checksum is
// dropped and the next level tried; a block held nowhere is ErrNotFound. A
// block whose fastest copy is in a tier that cannot be reached now (an
// object store that is down) fails with an error matching ErrUnavailable,
// not ErrNotFound, and the kind of that tier: it is cached, out of reach
// for now.
func (h *Hierarchy) Get(key index.Key, dst []byte) ([]byte, index.Header, index.TierKind, error) {
	var out []byte
	m, kind, err := h.read(key, func(t Tier) (index.Header, []byte, *bufpool.Buffer, error) {
		var m index.Header
		var err error
		out, m, err = t.Get(key, dst)
		return m, nil, nil, err // dst is the caller's: a promotion reads again
	})
	if err != nil {
		return dst, m, kind, err
	}
	return out, m, kind, nil
}

// read finds the fastest level holding key and reads it with fn, trying
// again when a concurrent move took the copy away or the copy was corrupt.
// fn may return the bytes it read when they may be shared read-only with a
// promotion, and with them the reference on the pooled buffer holding them
// (nil for bytes of no pool): the promotion takes a reference of its own.
//
// A copy that its tier no longer has while the hierarchy still records it
// is being dropped by the key's owner (a demotion deletes the faster copy
// before it records that, outside the lock): the read goes on to the next
// level that holds the key, and when every recorded copy has answered not
// found it waits until the owner is done and looks again. Going back to
// the same level instead could miss a block the node holds all along.
func (h *Hierarchy) read(key index.Key, fn func(Tier) (index.Header, []byte, *bufpool.Buffer, error)) (index.Header, index.TierKind, error) {
	var leaving uint8 // levels whose recorded copy their tier did not have
	for range 4 {
		if h.closed.Load() {
			return index.Header{}, 0, ErrClosed
		}
		r := h.readable.get(key)
		e := r.e
		if r.in != 0 && r.in&^leaving == 0 {
			h.lock()
			for e.busy && h.entries[key] == e && !h.closed.Load() {
				h.waitLocked(e) // its owner is dropping or moving every copy we tried
			}
			leaving = 0
			h.mu.Unlock()
			continue
		}
		if r.in == 0 {
			found, down, err := h.discover(key)
			if found {
				continue
			}
			if err != nil {
				return index.Header{}, h.levels[down].Kind, h.unreachable(down, key, err)
			}
			h.misses.Add(1)
			h.gets.Add(1)
			return index.Header{}, 0, fmt.Errorf("hierarchy: %v: %w", key, ErrNotFound)
		}
		i := bits.TrailingZeros8(r.in &^ leaving)
		l := h.levels[i]
		h.touched(i, key, e)

		m, shared, ref, err := fn(l.Tier)
		switch {
		case err == nil:
			h.gets.Add(1)
			l.hits.Add(1)
			if i > 0 && !h.cfg.NoPromote {
				h.promoteLater(promotion{key: key, from: i, data: shared, ref: ref.Retain(), meta: m})
			}
			return m, l.Kind, nil
		case errors.Is(err, ErrCorrupt):
			h.lost(i, key)
		case errors.Is(err, ErrUnavailable):
			return index.Header{}, l.Kind, h.unreachable(i, key, err)
		case !errors.Is(err, ErrNotFound):
			return index.Header{}, 0, err
		default:
			leaving |= 1 << i
		}
	}
	return index.Header{}, 0, fmt.Errorf("hierarchy: %v moved under four reads in a row: %w", key, ErrNotFound)
}

// unreachable counts a get of a block that level i holds but cannot read
// now (its tier failed with ErrUnavailable: an object store that is down)
// and returns the error for it, which matches ErrUnavailable, not
// ErrNotFound: the block is cached, the caller may try again later.
func (h *Hierarchy) unreachable(i int, key index.Key, err error) error {
	h.gets.Add(1)
	h.levels[i].unreachable.Add(1)
	return fmt.Errorf("hierarchy: %v held in %v, out of reach for now: %w", key, h.levels[i].Kind, err)
}

// Stat returns a block's Meta and the fastest kind of tier holding it.
func (h *Hierarchy) Stat(key index.Key) (index.Header, index.TierKind, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if e := h.entries[key]; e != nil && e.in != 0 {
		return e.meta, h.levels[bits.TrailingZeros8(e.in)].Kind, nil
	}
	return index.Header{}, 0, fmt.Errorf("hierarchy: %v: %w", key, ErrNotFound)
}

// Find is Stat that, for a key no level is known to hold, looks in the
// shared levels as Get does (blocks another node wrote to a shared object
// store) and records a copy it finds there.
func (h *Hierarchy) Find(key index.Key) (index.Header, index.TierKind, error) {
	m, kind, err := h.Stat(key)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return m, kind, err
	}
	if found, _, _ := h.discover(key); !found {
		return m, kind, err
	}
	return h.Stat(key)
}

// Lookup returns the longest prefix of chain this node can read — its own
// tiers and the shared ones — and how many leading blocks each tier holds,
// at the locations the hierarchy publishes (this node, or index.AnyNode
// for a shared level). It answers from the hierarchy's own records: a
// block of a shared level that another node wrote counts once a Get or
// Find has found it.
func (h *Hierarchy) Lookup(ns index.NamespaceID, chain []index.Hash) index.Prefix {
	var scan index.PrefixScan
	var locs [8]index.Location // one per level, at most 8
	h.mu.RLock()
	defer h.mu.RUnlock()
	for _, hash := range chain {
		n := 0
		if e := h.entries[index.Key{NS: ns, Hash: hash}]; e != nil {
			for in := e.in; in != 0; in &= in - 1 {
				locs[n] = h.levels[bits.TrailingZeros8(in)].loc
				n++
			}
		}
		if !scan.Next(locs[:n]) {
			break
		}
	}
	return scan.Prefix()
}

// Delete removes a block from every level. It fails with ErrPinned while an
// unexpired pin holds the block.
func (h *Hierarchy) Delete(key index.Key) error {
	h.lock()
	if h.pinnedLocked(key) {
		h.mu.Unlock()
		return fmt.Errorf("hierarchy: delete %v: %w", key, ErrPinned)
	}
	h.mu.Unlock()
	e, err := h.acquire(key, false)
	if err != nil {
		return err
	}
	for i := range h.levels {
		if e.in&(1<<i) != 0 {
			h.dropCopy(i, e, key)
		}
	}
	h.release(key, e)
	return nil
}

// DeleteFrom removes a block's copy from one level only (for an operator's
// "evict from the SSD"); ErrNotFound if that level does not hold it.
func (h *Hierarchy) DeleteFrom(kind index.TierKind, key index.Key) error {
	i := h.levelOf(kind)
	if i < 0 {
		return fmt.Errorf("hierarchy: no %v tier: %w", kind, ErrNotFound)
	}
	e, err := h.acquire(key, false)
	if err != nil {
		return err
	}
	defer h.release(key, e)
	if e.in&(1<<i) == 0 {
		return fmt.Errorf("hierarchy: %v not in %v: %w", key, kind, ErrNotFound)
	}
	h.dropCopy(i, e, key)
	return nil
}

// acquire waits until no writer owns key and takes ownership. With create,
// a key not held anywhere gets a fresh entry; else it is ErrNotFound.
func (h *Hierarchy) acquire(key index.Key, create bool) (*entry, error) {
	h.lock()
	defer h.mu.Unlock()
	for {
		if h.closed.Load() {
			return nil, ErrClosed
		}
		e := h.entries[key]
		if e == nil {
			if !create {
				return nil, fmt.Errorf("hierarchy: %v: %w", key, ErrNotFound)
			}
			e = &entry{}
			h.entries[key] = e
		}
		if !e.busy {
			e.busy = true
			return e, nil
		}
		h.waitLocked(e)
	}
}

// waitLocked waits until e's owner lets go of it or the hierarchy closes,
// with h.mu given up meanwhile; the caller holds h.mu, and holds it again
// on return, and must look at the entry again.
func (h *Hierarchy) waitLocked(e *entry) {
	if e.idle == nil {
		e.idle = make(chan struct{})
	}
	idle := e.idle
	h.mu.Unlock()
	select {
	case <-idle:
	case <-h.stop:
	}
	h.lock()
}

// release gives up ownership of key and forgets it if no level holds it.
func (h *Hierarchy) release(key index.Key, e *entry) {
	h.lock()
	h.releaseLocked(key, e)
	h.mu.Unlock()
}

// releaseLocked is release for a caller that holds h.mu.
func (h *Hierarchy) releaseLocked(key index.Key, e *entry) {
	e.busy = false
	h.unholdLocked(e, key)
	if e.in == 0 && h.entries[key] == e {
		delete(h.entries, key)
		h.publishLocked(key)
	}
	if e.idle != nil {
		close(e.idle)
		e.idle = nil
	}
}

// setLocked records that level i holds version m of e's key, turning
// the quota the key's owner held for the copy into its use.
func (h *Hierarchy) setLocked(e *entry, m index.Header, i int) {
	if e.holdIn == uint8(i+1) {
		h.unholdLocked(e, m.Key)
	}
	h.resizeLocked(e, m.Size)
	e.meta = m
	if e.in&(1<<i) == 0 {
		e.in |= 1 << i
		h.chargeLocked(i, m, 1)
		h.publishLocked(m.Key)
	} else {
		h.touchOwnLocked(i, m.Key)
	}
	h.addedLocked(i, m)
}

// addedLocked tells level i's policy and the listener about a new copy.
func (h *Hierarchy) addedLocked(i int, m index.Header) {
	l := h.levels[i]
	l.Policy.Add(policyEntry(m))
	if h.cfg.OnChange != nil {
		h.cfg.OnChange(index.Change{Kind: index.ChangeStored, Key: m.Key, Meta: m.Meta, Loc: l.loc})
	}
}

// removedLocked forgets level i's copy of key.
func (h *Hierarchy) removedLocked(i int, e *entry, key index.Key) {
	if e.in&(1<<i) != 0 {
		h.chargeLocked(i, e.meta, -1)
	}
	e.in &^= 1 << i
	h.publishLocked(key)
	h.levels[i].Policy.Remove(key)
	if h.cfg.OnChange != nil {
		h.cfg.OnChange(index.Change{Kind: index.ChangeRemoved, Key: key, Loc: h.levels[i].loc})
	}
}

// dropCopy deletes level i's copy of a key the caller owns.
func (h *Hierarchy) dropCopy(i int, e *entry, key index.Key) {
	_ = h.levels[i].Tier.Delete(key) // ErrNotFound: already gone, which is the goal
	h.lock()
	h.removedLocked(i, e, key)
	h.mu.Unlock()
}

// lost forgets level i's copy of key after the tier found it corrupt (and
// dropped it).
func (h *Hierarchy) lost(i int, key index.Key) {
	h.lock()
	defer h.mu.Unlock()
	if e := h.entries[key]; e != nil && e.in&(1<<i) != 0 {
		h.removedLocked(i, e, key)
		if e.in == 0 && !e.busy {
			delete(h.entries, key)
			h.publishLocked(key)
		}
	}
}

// touchLocked records an access to e's key by its owner, who holds the
// lock exclusively.
func (h *Hierarchy) touchLocked(key index.Key, e *entry) {
	e.atime.Store(time.Now().UnixNano())
	if h.sketch != nil {
		h.sketch.Increment(key)
	}
}

func (h *Hierarchy) levelOf(kind index.TierKind) int {
	for i, l := range h.levels {
		if l.Kind == kind {
			return i
		}
	}
	return -1
}

// Close stops the mover and closes every tier.
func (h *Hierarchy) Close() error {
	h.lock()
	if h.closed.Load() {
		h.mu.Unlock()
		return nil
	}
	h.closed.Store(true)
	h.mu.Unlock()
	close(h.stop) // wakes every waiter for a key (waitLocked)
	h.mover.Wait()
	var errs []error
	for _, l := range h.levels {
		if err := l.Tier.Close(); err != nil {
			errs = append(errs, fmt.Errorf("hierarchy: close %v: %w", l.Kind, err))
		}
	}
	return errors.Join(errs...)
}

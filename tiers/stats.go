package tiers

import "github.com/kvstrata/kvstrata/index"

// LevelStats is one level's accounting and movement counters, all counted
// since the hierarchy was opened.
type LevelStats struct {
	Kind   index.TierKind
	Policy string // the eviction policy's name
	Stats
	HighWatermark, LowWatermark float64
	// Unavailable says why the tier cannot be reached now (nil when it
	// can), for tiers that can be down (an object store).
	Unavailable error
	// Degraded says why the tier, although it can be read, refuses writes
	// now (nil when it does not), for tiers that report it (a local disk
	// that is full).
	Degraded error
	// Detail holds counters of the tier's own (objects, segments,
	// request errors …), for tiers that report them.
	Detail map[string]int64
	Hits   int64 // gets served by this level
	// Unreachable counts gets of blocks this level holds that failed
	// because it could not be reached then (ErrUnavailable): cached but
	// out of reach, neither a hit nor a miss.
	Unreachable int64
	Evictions   int64 // blocks this level gave up to make room
	Drops       int64 // evictions that kept no copy in a lower level
	Demotions   int64 // blocks this level received from the level above
	Promotions  int64 // blocks this level received from below
	// QuotaEvictions counts the evictions that made room for a block
	// within its tenant's quota (of that tenant's own blocks).
	QuotaEvictions int64
	// Tenants is each tenant's use of the level and its quota there, by
	// tag, for the tenants with blocks or a quota on it; empty unless
	// Config.Tenants is set.
	Tenants []TenantUsage
}

// HierarchyStats is a snapshot of a hierarchy's counters.
type HierarchyStats struct {
	Levels []LevelStats
	Gets   int64 // Get calls that found the hierarchy open
	Misses int64 // of which held nowhere (gets of unreachable blocks are not misses)
	Pins   int   // keys under an unreleased lease
	Keys   int   // distinct blocks held in some level
}

// Stats returns a snapshot of the hierarchy's counters.
func (h *Hierarchy) Stats() HierarchyStats {
	tierStats := make([]Stats, len(h.levels))
	down := make([]error, len(h.levels))
	degraded := make([]error, len(h.levels))
	detail := make([]map[string]int64, len(h.levels))
	for i, l := range h.levels { // outside h.mu: tiers have locks of their own
		tierStats[i] = l.Tier.Stats()
		if a, ok := l.Tier.(AvailabilityReporter); ok {
			down[i] = a.Available()
		}
		if d, ok := l.Tier.(DegradationReporter); ok {
			degraded[i] = d.Degraded()
		}
		if d, ok := l.Tier.(DetailReporter); ok {
			detail[i] = d.Detail()
		}
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	s := HierarchyStats{Gets: h.gets.Load(), Misses: h.misses.Load(), Pins: len(h.pins), Keys: len(h.entries)}
	for i, l := range h.levels {
		ls := LevelStats{
			Kind: l.Kind, Stats: tierStats[i], Hits: l.hits.Load(), Unreachable: l.unreachable.Load(), Evictions: l.evictions,
			Drops: l.drops, Demotions: l.demotions, Promotions: l.promotions,
			HighWatermark: l.HighWatermark, LowWatermark: l.LowWatermark, Policy: l.Policy.Name(),
			Unavailable: down[i], Degraded: degraded[i], Detail: detail[i],
			QuotaEvictions: l.quotaEvictions, Tenants: h.tenantStatsLocked(i),
		}
		s.Levels = append(s.Levels, ls)
	}
	return s
}

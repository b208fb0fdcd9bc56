package sim

import "slices"

// Grid is a sweep of caches: every policy at every capacity and, in
// multi-tier mode (SSDTokens set), over every SSD capacity. It is what
// kvctl sim replays.
type Grid struct {
	Policies []string // of Policies
	// Tokens are the cache capacities in tokens; in multi-tier mode, the
	// DRAM tier's.
	Tokens []int64
	// SSDTokens, when set, are the SSD capacities under each of Tokens.
	SSDTokens []int64
	// AdmitMinSeen is MultiTier.AdmitMinSeen for every multi-tier cache.
	AdmitMinSeen int
	// AdmitByFrequency is MultiTier.AdmitByFrequency for every multi-tier
	// cache.
	AdmitByFrequency bool
	// SSDPolicy is MultiTier.SSDPolicy for every multi-tier cache.
	SSDPolicy string
}

// Specs returns the grid's caches, policy by policy, then capacity by
// capacity. Belady keeps no tier hierarchy: in multi-tier mode it runs as
// one tier of the DRAM and SSD capacities together, the bound for the pair.
func (g Grid) Specs() []Spec {
	var specs []Spec
	for _, pol := range g.Policies {
		for _, c := range g.Tokens {
			if len(g.SSDTokens) == 0 {
				specs = append(specs, SingleTier{Policy: pol, CapacityTokens: c})
				continue
			}
			for _, ssd := range g.SSDTokens {
				if pol == "belady" {
					specs = append(specs, SingleTier{Policy: pol, CapacityTokens: c + ssd})
				} else {
					specs = append(specs, MultiTier{Policy: pol, DRAMTokens: c, SSDTokens: ssd, AdmitMinSeen: g.AdmitMinSeen, AdmitByFrequency: g.AdmitByFrequency, SSDPolicy: g.SSDPolicy})
				}
			}
		}
	}
	return specs
}

// TotalTokens is the capacity a spec has in all its tiers.
func TotalTokens(s Spec) int64 {
	switch s := s.(type) {
	case SingleTier:
		return s.CapacityTokens
	case MultiTier:
		return s.DRAMTokens + s.SSDTokens
	}
	return 0
}

// BeladyBounds returns, for each of results, the Belady result of the same
// total capacity (TotalTokens) among them, or nil where Belady did not run
// at that capacity. A policy's gap to the optimum is the bound's hit rate
// minus its own.
func BeladyBounds(results []Result) []*Result {
	belady := map[int64]int{}
	for i, r := range results {
		if s, ok := r.Spec.(SingleTier); ok && s.Policy == "belady" {
			belady[s.CapacityTokens] = i
		}
	}
	out := make([]*Result, len(results))
	for i, r := range results {
		if j, ok := belady[TotalTokens(r.Spec)]; ok {
			out[i] = &results[j]
		}
	}
	return out
}

// HasBelady reports whether the grid runs Belady, so that each result has
// a bound.
func (g Grid) HasBelady() bool { return slices.Contains(g.Policies, "belady") }

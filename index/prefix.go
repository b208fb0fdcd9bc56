package index

import (
	"cmp"
	"slices"
)

// PrefixScan computes a longest-prefix lookup one block at a time, over
// any record of where blocks live (a Directory, or a node's own tiers):
// the caller passes the locations of each block of the chain in turn to
// Next until it returns false, then takes the answer from Prefix. The zero
// value is ready and counts every location. A PrefixScan is not safe for
// concurrent use.
type PrefixScan struct {
	// Usable, if set, says which locations count: others are ignored (a
	// node marked down, say).
	Usable func(Location) bool

	p    Prefix
	live []Location // the locations that have held every block so far
	done bool
}

// Next takes the locations holding the next block of the chain (the caller
// may reuse the slice afterwards) and reports whether a usable one holds
// it. Once it returns false the lookup has ended: later calls change
// nothing and return false.
func (s *PrefixScan) Next(locs []Location) bool {
	if s.done {
		return false
	}
	i := s.p.Blocks
	if i == 0 {
		s.live = slices.Grow(s.live, len(locs))
	}
	found := false
	for _, l := range locs {
		if s.Usable != nil && !s.Usable(l) {
			continue
		}
		found = true
		if i > 0 {
			break
		}
		s.live = append(s.live, l)
	}
	if !found {
		s.done = true
		return false
	}
	if i > 0 {
		// Locations missing block i hold exactly i leading blocks.
		s.live = slices.DeleteFunc(s.live, func(l Location) bool {
			if slices.Contains(locs, l) {
				return false
			}
			s.p.ByLocation = append(s.p.ByLocation, LocationBlocks{Location: l, Blocks: i})
			return true
		})
	}
	s.p.Blocks = i + 1
	return true
}

// Prefix ends the lookup and returns its answer: how many leading blocks
// some usable location holds, and for every usable location holding the
// first block how many leading blocks it holds, most first (ties by tier,
// then node).
func (s *PrefixScan) Prefix() Prefix {
	s.p.ByLocation = slices.Grow(s.p.ByLocation, len(s.live))
	for _, l := range s.live {
		s.p.ByLocation = append(s.p.ByLocation, LocationBlocks{Location: l, Blocks: s.p.Blocks})
	}
	s.live, s.done = nil, true
	p := s.p
	slices.SortFunc(p.ByLocation, func(a, b LocationBlocks) int {
		if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Location.Tier, b.Location.Tier); c != 0 {
			return c
		}
		return cmp.Compare(a.Location.Node, b.Location.Node)
	})
	return p
}

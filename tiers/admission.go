package tiers

import "github.com/kvstrata/kvstrata/index"

// sketch is a count-min sketch of recent accesses, with 4-bit counters that
// are halved every resetAfter increments so that old popularity fades (as in
// TinyLFU). It answers "how often was this key seen lately?" for every key,
// cached or not, in a fixed 2 KiB per 1,024 counters. Not safe for
// concurrent use.
type sketch struct {
	rows       [4][]uint8
	mask       uint64
	adds       int
	resetAfter int
}

func newSketch(width int) *sketch {
	w := 1
	for w < width {
		w <<= 1
	}
	s := &sketch{mask: uint64(w - 1), resetAfter: 10 * w}
	for i := range s.rows {
		s.rows[i] = make([]uint8, w)
	}
	return s
}

// slot spreads k over the rows with four independent multipliers.
func (s *sketch) slot(k index.Key, row int) uint64 {
	seeds := [4]uint64{0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93}
	h := (uint64(k.Hash) ^ uint64(k.NS)*0xFF51AFD7ED558CCD) * seeds[row]
	return (h ^ h>>29) & s.mask
}

func (s *sketch) add(k index.Key) {
	for r := range s.rows {
		if c := &s.rows[r][s.slot(k, r)]; *c < 15 {
			*c++
		}
	}
	if s.adds++; s.adds >= s.resetAfter {
		s.adds = 0
		for r := range s.rows {
			for i := range s.rows[r] {
				s.rows[r][i] >>= 1
			}
		}
	}
}

func (s *sketch) estimate(k index.Key) int {
	est := uint8(15)
	for r := range s.rows {
		est = min(est, s.rows[r][s.slot(k, r)])
	}
	return int(est)
}

package policy

import "github.com/kvstrata/kvstrata/index"

// Sketch estimates how often each key was accessed lately, cached or not,
// in bounded memory (TinyLFU, Einziger et al. 2017): a count-min sketch of
// four rows of 4-bit counters packed sixteen to a word, behind a doorkeeper
// bit set that absorbs each key's first access so that one-hit wonders
// never reach the counters. After 10 increments per block the cache holds
// every counter is halved and the doorkeeper cleared, so old popularity
// fades.
//
// Estimate counts the doorkeeper's bit as one access: a key seen once
// estimates 1, twice 2, up to 16. Memory is 8 bytes of counters and 4 bytes
// of doorkeeper per block. Increment and Estimate are O(1). Not safe
// for concurrent use.
type Sketch struct {
	rows       [sketchDepth][]uint64 // 16 counters of 4 bits per word
	door       []uint64              // doorkeeper bits, 8 per unit of width
	mask       uint64                // width - 1
	doorMask   uint64                // bits in door - 1
	adds       int
	resetAfter int
}

const sketchDepth = 4

// NewSketch returns a sketch for a cache of about blocks blocks: each row
// has 4 × blocks counters (rounded up to a power of two, at least 64), so
// that collisions rarely lift a block used once, and the counters are
// halved after 10 × blocks increments.
func NewSketch(blocks int) *Sketch {
	w := 64
	for w < 4*blocks {
		w <<= 1
	}
	s := &Sketch{mask: uint64(w - 1), resetAfter: 10 * max(blocks, w/4)}
	for i := range s.rows {
		s.rows[i] = make([]uint64, w/16)
	}
	s.door = make([]uint64, w/8)
	s.doorMask = uint64(len(s.door)*64 - 1)
	return s
}

// Width returns the number of counters per row.
func (s *Sketch) Width() int { return int(s.mask + 1) }

var sketchSeeds = [sketchDepth]uint64{0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93}

func keyHash(k index.Key) uint64 {
	h := uint64(k.Hash) ^ uint64(k.NS)*0xFF51AFD7ED558CCD
	h ^= h >> 33
	h *= 0xC4CEB9FE1A85EC53
	return h ^ h>>29
}

func (s *Sketch) slot(h uint64, row int) uint64 {
	x := h * sketchSeeds[row]
	return (x ^ x>>31) & s.mask
}

// doorBits returns the doorkeeper's two bit positions for h.
func (s *Sketch) doorBits(h uint64) (uint64, uint64) {
	return h & s.doorMask, (h >> 32) & s.doorMask
}

// Increment records one access to k.
func (s *Sketch) Increment(k index.Key) {
	h := keyHash(k)
	a, b := s.doorBits(h)
	if s.door[a/64]&(1<<(a%64)) == 0 || s.door[b/64]&(1<<(b%64)) == 0 {
		s.door[a/64] |= 1 << (a % 64)
		s.door[b/64] |= 1 << (b % 64)
	} else {
		for r := range s.rows {
			i := s.slot(h, r)
			w, shift := &s.rows[r][i/16], (i%16)*4
			if (*w>>shift)&0xF < 15 {
				*w += 1 << shift
			}
		}
	}
	if s.adds++; s.adds >= s.resetAfter {
		s.halve()
	}
}

// halve ages the sketch: every counter is halved, the doorkeeper cleared.
func (s *Sketch) halve() {
	s.adds = 0
	for r := range s.rows {
		for i, w := range s.rows[r] {
			s.rows[r][i] = (w >> 1) & 0x7777777777777777
		}
	}
	clear(s.door)
}

// Estimate returns how often k was accessed lately (0 to 16).
func (s *Sketch) Estimate(k index.Key) int {
	h := keyHash(k)
	est := uint64(15)
	for r := range s.rows {
		i := s.slot(h, r)
		est = min(est, (s.rows[r][i/16]>>((i%16)*4))&0xF)
	}
	if a, b := s.doorBits(h); s.door[a/64]&(1<<(a%64)) != 0 && s.door[b/64]&(1<<(b%64)) != 0 {
		est++
	}
	return int(est)
}

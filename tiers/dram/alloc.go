package dram

import "math/bits"

// allocator hands out contiguous runs of pages ("extents") from a fixed
// range [0, pages). Free extents are kept coalesced, indexed by start and by
// end (to merge neighbours on free) and by size class (the bit length of
// their page count) to find one that fits. With the uniform block sizes of
// one model, a freed extent is reused exactly and the arena does not
// fragment. Not safe for concurrent use.
type allocator struct {
	pages   uint32
	free    uint32            // free pages
	byStart map[uint32]uint32 // free extent start → length
	byEnd   map[uint32]uint32 // free extent end (exclusive) → start
	classes [33]map[uint32]struct{}
}

func newAllocator(pages uint32) *allocator {
	a := &allocator{pages: pages, free: pages, byStart: map[uint32]uint32{}, byEnd: map[uint32]uint32{}}
	for i := range a.classes {
		a.classes[i] = map[uint32]struct{}{}
	}
	if pages > 0 {
		a.insert(0, pages)
	}
	return a
}

func class(n uint32) int { return bits.Len32(n) }

func (a *allocator) insert(start, n uint32) {
	a.byStart[start] = n
	a.byEnd[start+n] = start
	a.classes[class(n)][start] = struct{}{}
}

func (a *allocator) erase(start, n uint32) {
	delete(a.byStart, start)
	delete(a.byEnd, start+n)
	delete(a.classes[class(n)], start)
}

// scanLimit bounds how many too-small extents alloc first looks at in the
// exact size class before it tries the larger classes, where every extent
// fits; only when those are empty does it scan the exact class to the end.
const scanLimit = 8

// alloc returns the first page of a free extent of n > 0 pages.
func (a *allocator) alloc(n uint32) (uint32, bool) {
	if n == 0 || n > a.free {
		return 0, false
	}
	c := class(n)
	if start, ok := a.fit(c, n, scanLimit); ok {
		return start, true
	}
	for big := c + 1; big < len(a.classes); big++ {
		if start, ok := a.fit(big, n, 1); ok {
			return start, true
		}
	}
	return a.fit(c, n, len(a.classes[c]))
}

// fit takes n pages from the first extent of class c that holds them,
// looking at no more than limit extents.
func (a *allocator) fit(c int, n uint32, limit int) (uint32, bool) {
	seen := 0
	for start := range a.classes[c] {
		if seen == limit {
			break
		}
		seen++
		l := a.byStart[start]
		if l < n {
			continue
		}
		a.erase(start, l)
		if l > n {
			a.insert(start+n, l-n)
		}
		a.free -= n
		return start, true
	}
	return 0, false
}

// release returns the extent [start, start+n) and merges it with free
// neighbours.
func (a *allocator) release(start, n uint32) {
	if n == 0 {
		return
	}
	a.free += n
	if prev, ok := a.byEnd[start]; ok {
		pl := a.byStart[prev]
		a.erase(prev, pl)
		start, n = prev, n+pl
	}
	if nl, ok := a.byStart[start+n]; ok {
		a.erase(start+n, nl)
		n += nl
	}
	a.insert(start, n)
}

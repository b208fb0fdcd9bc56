// Package arena keeps track of which pages of a fixed pool are free: it
// hands out contiguous runs of pages ("extents") of a range [0, pages) and
// takes them back. It knows nothing of where the pages' bytes live — the
// DRAM tier maps them onto host memory it mmaps, a device tier onto a pool
// of device memory — nor of their size: callers turn page numbers into
// offsets. An Allocator is not safe for concurrent use; callers hold the
// lock that guards the memory they hand out.
package arena

import "math/bits"

// Allocator hands out extents of a range [0, pages). Free extents are kept
// coalesced, indexed by start and by end (to merge neighbours on free) and
// by size class (the bit length of their page count) to find one that
// fits. With the uniform block sizes of one model, a freed extent is reused
// exactly and the pool does not fragment.
type Allocator struct {
	pages   uint32
	free    uint32            // free pages
	byStart map[uint32]uint32 // free extent start → length
	byEnd   map[uint32]uint32 // free extent end (exclusive) → start
	classes [33]map[uint32]struct{}
}

// New returns an Allocator of pages pages, all free.
func New(pages uint32) *Allocator {
	a := &Allocator{pages: pages, free: pages, byStart: map[uint32]uint32{}, byEnd: map[uint32]uint32{}}
	for i := range a.classes {
		a.classes[i] = map[uint32]struct{}{}
	}
	if pages > 0 {
		a.insert(0, pages)
	}
	return a
}

func class(n uint32) int { return bits.Len32(n) }

func (a *Allocator) insert(start, n uint32) {
	a.byStart[start] = n
	a.byEnd[start+n] = start
	a.classes[class(n)][start] = struct{}{}
}

func (a *Allocator) erase(start, n uint32) {
	delete(a.byStart, start)
	delete(a.byEnd, start+n)
	delete(a.classes[class(n)], start)
}

// scanLimit bounds how many too-small extents Alloc first looks at in the
// exact size class before it tries the larger classes, where every extent
// fits; only when those are empty does it scan the exact class to the end.
const scanLimit = 8

// Pages returns the size of the range, in pages.
func (a *Allocator) Pages() uint32 { return a.pages }

// Free returns the number of free pages (not necessarily contiguous).
func (a *Allocator) Free() uint32 { return a.free }

// Alloc returns the first page of a free extent of n > 0 pages, or false
// when no free extent holds n pages.
func (a *Allocator) Alloc(n uint32) (uint32, bool) {
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
func (a *Allocator) fit(c int, n uint32, limit int) (uint32, bool) {
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

// Release returns the extent [start, start+n), which Alloc(n) handed out,
// and merges it with free neighbours.
func (a *Allocator) Release(start, n uint32) {
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

package policy

import "github.com/kvstrata/kvstrata/index"

// heapItem is an element of a minHeap. The heap orders items by (major,
// minor), smallest first; each policy decides what the two numbers mean
// (LFU: priority then recency, prefix: recency alone, Belady: distance to
// the next use then recency).
type heapItem struct {
	key   index.Key
	major int64
	minor uint64
	pos   int // index in minHeap.items; -1 while not in a heap
}

func (a *heapItem) less(b *heapItem) bool {
	if a.major != b.major {
		return a.major < b.major
	}
	return a.minor < b.minor
}

// minHeap is an indexed binary min-heap: every item knows its position, so
// fix and remove of any item take O(log n). The zero value is empty.
type minHeap struct {
	items []*heapItem
	// scratch is reused by firstUnskipped so that a Victim call with a
	// skip function allocates nothing in the steady state.
	scratch []int
}

func (h *minHeap) len() int { return len(h.items) }

// push adds it, which must not be in a heap.
func (h *minHeap) push(it *heapItem) {
	it.pos = len(h.items)
	h.items = append(h.items, it)
	h.up(it.pos)
}

// remove takes it out of the heap; it must be in this heap.
func (h *minHeap) remove(it *heapItem) {
	i, last := it.pos, len(h.items)-1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	it.pos = -1
	if i != last {
		h.fix(h.items[i])
	}
}

// fix restores the heap order after its major or minor changed.
func (h *minHeap) fix(it *heapItem) {
	if !h.down(it.pos) {
		h.up(it.pos)
	}
}

func (h *minHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].pos = i
	h.items[j].pos = j
}

func (h *minHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.items[i].less(h.items[parent]) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down sifts item i towards the leaves and reports whether it moved.
func (h *minHeap) down(i int) bool {
	start, n := i, len(h.items)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h.items[r].less(h.items[c]) {
			c = r
		}
		if !h.items[c].less(h.items[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}

// firstUnskipped returns the smallest item whose key skip does not reject,
// without changing the heap. It visits the heap best-first from the root: an
// item is only looked at once its parent has been skipped, so a call that
// skips k items costs O(k log k) and the skipped items stay where they are.
func (h *minHeap) firstUnskipped(skip func(index.Key) bool) (*heapItem, bool) {
	if len(h.items) == 0 {
		return nil, false
	}
	if skip == nil || !skip(h.items[0].key) {
		return h.items[0], true
	}
	// frontier is a min-heap of positions in h.items, ordered like h.
	frontier := append(h.scratch[:0], 0)
	defer func() { h.scratch = frontier[:0] }()
	lessAt := func(a, b int) bool { return h.items[frontier[a]].less(h.items[frontier[b]]) }
	for len(frontier) > 0 {
		// Pop the smallest position off the frontier.
		i := frontier[0]
		last := len(frontier) - 1
		frontier[0] = frontier[last]
		frontier = frontier[:last]
		siftDown(frontier, 0, lessAt)
		if i != 0 && !skip(h.items[i].key) {
			return h.items[i], true
		}
		for c := 2*i + 1; c <= 2*i+2 && c < len(h.items); c++ {
			frontier = append(frontier, c)
			siftUp(frontier, len(frontier)-1, lessAt)
		}
	}
	return nil, false
}

func siftUp(a []int, i int, less func(i, j int) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(i, p) {
			return
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func siftDown(a []int, i int, less func(i, j int) bool) {
	for {
		c := 2*i + 1
		if c >= len(a) {
			return
		}
		if r := c + 1; r < len(a) && less(r, c) {
			c = r
		}
		if !less(c, i) {
			return
		}
		a[i], a[c] = a[c], a[i]
		i = c
	}
}

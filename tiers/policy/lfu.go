package policy

import "github.com/kvstrata/kvstrata/index"

// LFU is least-frequently-used eviction with dynamic aging (LFU-DA, Arlitt
// et al. 2000). Each block has the priority
//
//	K = L + count
//
// where count is the number of accesses (Add and Touch) since the block
// entered the policy, and L, the cache age, is the priority of the last
// evicted block, taken when the block was last accessed. The block with the
// lowest K goes first; among equal K, the least recently accessed.
//
// Plain LFU keeps a block that was hot long ago forever; under LFU-DA every
// eviction raises L, so newly accessed blocks start at ever higher
// priorities and an old hot block that is no longer touched is eventually
// overtaken and evicted.
//
// Evictions: a Policy is not told why a block goes, so LFU counts as an
// eviction a Remove of the key that the latest Victim call returned, with no
// Add or Touch in between (the victim-then-remove sequence every tier
// follows). Any other Remove — an explicit delete — forgets the block
// without ageing the cache.
//
// Add, Touch and Remove take O(log n); Victim takes O(log n) plus O(k log k)
// for k skipped blocks.
type LFU struct {
	heap  minHeap
	items map[index.Key]*lfuItem
	age   int64  // L
	clock uint64 // access sequence, for recency ties

	victim    index.Key // returned by the latest Victim call
	hasVictim bool      // victim is set and nothing was accessed since
}

type lfuItem struct {
	heapItem // major: K, minor: access sequence
	entry    Entry
	count    int64
}

var _ Policy = (*LFU)(nil)

// NewLFU returns an empty LFU-DA policy.
func NewLFU() *LFU { return &LFU{items: make(map[index.Key]*lfuItem)} }

func (p *LFU) Add(e Entry) {
	if it := p.items[e.Key]; it != nil {
		it.entry = e
		p.access(it)
		return
	}
	p.hasVictim = false
	p.clock++
	it := &lfuItem{entry: e, count: 1}
	it.key, it.major, it.minor = e.Key, p.age+1, p.clock
	p.items[e.Key] = it
	p.heap.push(&it.heapItem)
}

func (p *LFU) Touch(key index.Key) bool {
	it := p.items[key]
	if it == nil {
		return false
	}
	p.access(it)
	return true
}

func (p *LFU) access(it *lfuItem) {
	p.hasVictim = false
	p.clock++
	it.count++
	it.major, it.minor = p.age+it.count, p.clock
	p.heap.fix(&it.heapItem)
}

func (p *LFU) Remove(key index.Key) {
	it := p.items[key]
	if it == nil {
		return
	}
	if p.hasVictim && p.victim == key {
		// An eviction: the cache ages to the victim's priority. max keeps L
		// monotonic when skipping made the victim a block above L.
		p.age = max(p.age, it.major)
	}
	p.hasVictim = false
	p.heap.remove(&it.heapItem)
	delete(p.items, key)
}

func (p *LFU) Victim(skip func(index.Key) bool) (index.Key, bool) {
	it, ok := p.heap.firstUnskipped(skip)
	if !ok {
		return index.Key{}, false
	}
	p.victim, p.hasVictim = it.key, true
	return it.key, true
}

func (p *LFU) Len() int { return len(p.items) }

// Age returns L, the priority of the last evicted block.
func (p *LFU) Age() int64 { return p.age }

func (p *LFU) Name() string { return "lfu" }

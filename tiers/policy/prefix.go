package policy

import "github.com/kvstrata/kvstrata/index"

// Prefix is prefix-aware eviction. A block is useless without its ancestors
// (a lookup stops at the first missing block), and evicting an ancestor
// strands every block below it, so Prefix only evicts leaves: blocks none of
// whose children it holds. Among leaves it evicts the least recently used.
//
// A block's children are the held blocks whose Entry names it as Parent (in
// the same namespace). The relation is kept by key, so the order of arrival
// does not matter: a parent added after its children starts with them
// counted, a parent removed while children remain leaves them parentless
// until it comes back, and re-adding a block with another parent moves it
// under the new one. A block that names itself as its parent has none.
//
// When every block that skip lets through has held children — impossible
// without skip, since a finite set of chains always has a leaf, but possible
// when skip passes over all leaves, or with cyclic parents — Victim falls back
// to the least recently used block that skip lets through, so it fails only
// when skip rejects every block.
//
// Add, Touch and Remove take O(log n); Victim takes O(log n) plus O(k log k)
// for k skipped leaves (and a walk of the recency list in the fallback).
type Prefix struct {
	leaves minHeap // held blocks with no held children, by last access
	recent list    // every held block, most recent first: the fallback order
	items  map[index.Key]*prefixItem
	// children counts, for each key, the held blocks naming it as their
	// parent, whether or not the key itself is held.
	children map[index.Key]int
	clock    uint64
}

type prefixItem struct {
	node     // element of recent; node.entry is the block's Entry
	heapItem // minor: last access; pos is -1 while the block has held children
}

var _ Policy = (*Prefix)(nil)

// NewPrefix returns an empty prefix-aware policy.
func NewPrefix() *Prefix {
	return &Prefix{
		items:    make(map[index.Key]*prefixItem),
		children: make(map[index.Key]int),
	}
}

func (p *Prefix) Add(e Entry) {
	if it := p.items[e.Key]; it != nil {
		old := it.entry
		it.entry = e
		if op, ok := parentKey(old); ok {
			if np, ok := parentKey(e); !ok || np != op {
				p.unlink(op)
				p.link(e)
			}
		} else {
			p.link(e)
		}
		p.access(it)
		return
	}
	p.clock++
	it := &prefixItem{node: node{entry: e}}
	it.key, it.minor, it.pos = e.Key, p.clock, -1
	p.items[e.Key] = it
	p.recent.pushFront(&it.node)
	p.link(e)
	if p.children[e.Key] == 0 {
		p.leaves.push(&it.heapItem)
	}
}

func (p *Prefix) Touch(key index.Key) bool {
	it := p.items[key]
	if it == nil {
		return false
	}
	p.access(it)
	return true
}

func (p *Prefix) access(it *prefixItem) {
	p.clock++
	it.minor = p.clock
	p.recent.moveToFront(&it.node)
	if it.pos >= 0 {
		p.leaves.fix(&it.heapItem)
	}
}

func (p *Prefix) Remove(key index.Key) {
	it := p.items[key]
	if it == nil {
		return
	}
	if pk, ok := parentKey(it.entry); ok {
		p.unlink(pk)
	}
	if it.pos >= 0 {
		p.leaves.remove(&it.heapItem)
	}
	p.recent.remove(&it.node)
	delete(p.items, key)
	// p.children[key] stays: the children are still held and name key as
	// their parent, so key starts with them counted if it comes back.
}

// link counts e as a child of its parent; a held parent stops being a leaf.
func (p *Prefix) link(e Entry) {
	pk, ok := parentKey(e)
	if !ok {
		return
	}
	p.children[pk]++
	if par := p.items[pk]; par != nil && par.pos >= 0 {
		p.leaves.remove(&par.heapItem)
	}
}

// unlink takes one child away from parent; a held parent left without
// children becomes a leaf.
func (p *Prefix) unlink(parent index.Key) {
	n := p.children[parent] - 1
	if n > 0 {
		p.children[parent] = n
		return
	}
	delete(p.children, parent)
	if par := p.items[parent]; par != nil && par.pos < 0 {
		p.leaves.push(&par.heapItem)
	}
}

func (p *Prefix) Victim(skip func(index.Key) bool) (index.Key, bool) {
	if it, ok := p.leaves.firstUnskipped(skip); ok {
		return it.key, true
	}
	return p.recent.lastUnskipped(skip)
}

func (p *Prefix) Len() int { return len(p.items) }

// parentKey returns the key of e's parent, if e names one other than itself.
func parentKey(e Entry) (index.Key, bool) {
	if !e.HasParent {
		return index.Key{}, false
	}
	k := index.Key{NS: e.Key.NS, Hash: e.Parent}
	return k, k != e.Key
}

func (p *Prefix) Name() string { return "prefix" }

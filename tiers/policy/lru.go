package policy

import "github.com/kvstrata/kvstrata/index"

// LRU evicts the least recently used block.
type LRU struct {
	list  list // front: most recent
	nodes map[index.Key]*node
}

var _ Policy = (*LRU)(nil)

// NewLRU returns an empty LRU policy.
func NewLRU() *LRU { return &LRU{nodes: make(map[index.Key]*node)} }

func (p *LRU) Add(e Entry) {
	if n := p.nodes[e.Key]; n != nil {
		n.entry = e
		p.list.moveToFront(n)
		return
	}
	n := &node{entry: e}
	p.nodes[e.Key] = n
	p.list.pushFront(n)
}

func (p *LRU) Touch(key index.Key) bool {
	n := p.nodes[key]
	if n == nil {
		return false
	}
	p.list.moveToFront(n)
	return true
}

func (p *LRU) Remove(key index.Key) {
	if n := p.nodes[key]; n != nil {
		p.list.remove(n)
		delete(p.nodes, key)
	}
}

func (p *LRU) Victim(skip func(index.Key) bool) (index.Key, bool) {
	return p.list.lastUnskipped(skip)
}

func (p *LRU) Len() int { return len(p.nodes) }

// node is an element of an intrusive doubly-linked list.
type node struct {
	entry      Entry
	prev, next *node
}

// list is a doubly-linked list with a sentinel; the zero value is empty.
type list struct{ root node }

func (l *list) lazyInit() {
	if l.root.next == nil {
		l.root.next, l.root.prev = &l.root, &l.root
	}
}

func (l *list) pushFront(n *node) {
	l.lazyInit()
	n.prev, n.next = &l.root, l.root.next
	l.root.next.prev = n
	l.root.next = n
}

func (l *list) remove(n *node) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (l *list) moveToFront(n *node) {
	if l.root.next == n {
		return
	}
	l.remove(n)
	l.pushFront(n)
}

// lastUnskipped walks from the back (least recent) to the first entry not
// skipped.
func (l *list) lastUnskipped(skip func(index.Key) bool) (index.Key, bool) {
	l.lazyInit()
	for n := l.root.prev; n != &l.root; n = n.prev {
		if skip == nil || !skip(n.entry.Key) {
			return n.entry.Key, true
		}
	}
	return index.Key{}, false
}

func (p *LRU) Name() string { return "lru" }

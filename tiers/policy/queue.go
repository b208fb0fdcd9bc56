package policy

import "github.com/kvstrata/kvstrata/index"

// qnode is a block in one of the queues of S3FIFO or WTinyLFU.
type qnode struct {
	entry      Entry
	prev, next *qnode
	queue      uint8 // which of the policy's queues holds it
	freq       uint8 // S3FIFO's 2-bit access count
}

// qlist is a doubly-linked list of qnodes with a sentinel and a length;
// the zero value is empty. Front is newest.
type qlist struct {
	root qnode
	len  int
}

func (l *qlist) lazyInit() {
	if l.root.next == nil {
		l.root.next, l.root.prev = &l.root, &l.root
	}
}

func (l *qlist) pushFront(n *qnode) {
	l.lazyInit()
	n.prev, n.next = &l.root, l.root.next
	l.root.next.prev = n
	l.root.next = n
	l.len++
}

func (l *qlist) remove(n *qnode) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
	l.len--
}

func (l *qlist) moveToFront(n *qnode) {
	if l.root.next == n {
		return
	}
	l.remove(n)
	l.pushFront(n)
}

// back returns the oldest node, or nil.
func (l *qlist) back() *qnode {
	if l.len == 0 {
		return nil
	}
	return l.root.prev
}

// prev returns the node in front of n (newer), or nil at the front.
func (l *qlist) prev(n *qnode) *qnode {
	if n.prev == &l.root {
		return nil
	}
	return n.prev
}

// firstUnskipped returns the oldest node skip lets through, or nil.
func (l *qlist) firstUnskipped(skip func(index.Key) bool) *qnode {
	for n := l.back(); n != nil; n = l.prev(n) {
		if skip == nil || !skip(n.entry.Key) {
			return n
		}
	}
	return nil
}

// lastVictim remembers the block the latest Victim call returned until the
// policy changes, so that Victim asked twice answers the same although it
// moves blocks between queues on the way.
type lastVictim struct {
	key   index.Key
	valid bool
}

func (v *lastVictim) forget() { v.valid = false }

func (v *lastVictim) set(k index.Key, ok bool) { v.key, v.valid = k, ok }

func (v *lastVictim) get(skip func(index.Key) bool) (index.Key, bool) {
	if !v.valid || (skip != nil && skip(v.key)) {
		return index.Key{}, false
	}
	return v.key, true
}

package policy

import "github.com/kvstrata/kvstrata/index"

// chainCounts counts, for each key, the held blocks naming it as their
// parent (in the same namespace), whether or not the key itself is held —
// as Prefix does — for the prefix-aware forms of the queue policies. A nil
// *chainCounts counts nothing: every method is a no-op and hasChildren is
// false, so a policy's plain form pays nothing.
type chainCounts struct{ children map[index.Key]int32 }

func newChainCounts() *chainCounts { return &chainCounts{children: make(map[index.Key]int32)} }

func (c *chainCounts) link(e Entry) {
	if c == nil {
		return
	}
	if pk, ok := parentKey(e); ok {
		c.children[pk]++
	}
}

func (c *chainCounts) unlink(e Entry) {
	if c == nil {
		return
	}
	if pk, ok := parentKey(e); ok {
		if c.children[pk] <= 1 {
			delete(c.children, pk)
		} else {
			c.children[pk]--
		}
	}
}

// reparent moves a held block from old's parent to e's.
func (c *chainCounts) reparent(old, e Entry) {
	c.unlink(old)
	c.link(e)
}

func (c *chainCounts) hasChildren(k index.Key) bool {
	return c != nil && c.children[k] > 0
}

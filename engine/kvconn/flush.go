package kvconn

import (
	"context"
	"fmt"
)

// Flush waits until the offload queue is empty: every block Offload
// queued before the call (and, until the queue first empties, while it
// waits) stored in the cache or given up on. It returns how many blocks were given up on meanwhile:
// dropped over the queue bound, refused by the node, or, when ctx ends
// first, still waiting (Flush then returns ctx's error; the offloader
// keeps trying them until Close, but the caller cannot count on them).
// A worker going away calls it before Close, so that its offloads are
// waited for as long as the caller chooses rather than Close's bound.
func (c *Conn) Flush(ctx context.Context) (dropped int, err error) {
	o := c.off
	o.mu.Lock()
	from, empty := o.dropped, o.empty
	o.mu.Unlock()
	flushed := false
	select {
	case <-empty:
		flushed = true
	case <-ctx.Done():
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	dropped = int(o.dropped - from)
	if left := len(o.queue); !flushed && left > 0 {
		return dropped + left, fmt.Errorf("kvconn: flush: %d blocks still waiting to be offloaded: %w", left, context.Cause(ctx))
	}
	return dropped, nil
}

// Dropped is how many blocks Offload has given up on since New (the
// kvstrata_engine_offload_dropped_blocks_total metric, as a number).
func (c *Conn) Dropped() int {
	o := c.off
	o.mu.Lock()
	defer o.mu.Unlock()
	return int(o.dropped)
}

// emptied records whether the queue is empty now: o.empty is closed
// while it is, and a new, open channel once blocks are queued. o.mu is
// held.
func (o *offloader) emptied(empty bool) {
	select {
	case <-o.empty: // closed: it was empty
		if !empty {
			o.empty = make(chan struct{})
		}
	default:
		if empty {
			close(o.empty)
		}
	}
}

package resp

import (
	"context"
	"sync"
	"time"
)

// budget bounds the bytes all connections hold for commands not yet
// received whole (Config.MaxPendingBytes). Safe for concurrent use.
type budget struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	waiters int
	freed   chan struct{} // closed, and replaced, when bytes come back while someone waits
}

func newBudget(limit int64) *budget {
	return &budget{limit: limit, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting for them until deadline or until ctx
// ends; it reports whether it got them.
func (b *budget) acquire(ctx context.Context, n int64, deadline time.Time) bool {
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return true
		}
		freed := b.freed
		b.waiters++
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		var ok bool
		select {
		case <-freed:
			ok = true
		case <-timer.C:
		case <-ctx.Done():
		}
		b.mu.Lock()
		b.waiters--
		b.mu.Unlock()
		if !ok {
			return false
		}
	}
}

// release hands back n bytes taken by acquire.
func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.waiters > 0 {
		close(b.freed)
		b.freed = make(chan struct{})
	}
}

// inUse returns the bytes taken.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

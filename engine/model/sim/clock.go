package sim

import (
	"context"
	"sync"
	"time"
)

// VirtualClock is time that passes only when a model sleeps on it: a sim
// model given Config.Sleep = c.Sleep runs in virtual time, so tests and
// in-process replays take no wall-clock time for modelled steps. It is
// safe for concurrent use; concurrent sleepers each advance it by their
// own duration, as if they ran one after the other.
type VirtualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewVirtualClock returns a clock reading start.
func NewVirtualClock(start time.Time) *VirtualClock { return &VirtualClock{now: start} }

// Now is the clock's time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep advances the clock by d and returns at once, or returns ctx's
// error, advancing nothing, when ctx is already done.
func (c *VirtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(max(d, 0))
	return nil
}

// AdvanceTo moves the clock to t when t is later than its time; an earlier
// t changes nothing. A simulation that runs several clocks on one timeline
// uses it to bring an idle one up to the time of its next event.
func (c *VirtualClock) AdvanceTo(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}

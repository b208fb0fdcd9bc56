package virtual

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

// ErrAwaitingAck is Scale's answer while the pool's last decision is
// neither acknowledged nor older than Config.AckTimeout: the planner
// retries on its next step.
var ErrAwaitingAck = errors.New("virtual: last decision not acknowledged yet")

// Config is a Connector's settings; zero fields take the defaults named.
type Config struct {
	// AckTimeout is how long a pool's change waits for the outside
	// system's ack before the next change may replace it. The default is
	// 10 min.
	AckTimeout time.Duration
	// Initial is each pool's size before its first record: Replicas
	// reports it as desired and ready. Pools absent here and from the
	// store are not reported.
	Initial map[planner.Pool]int
	// Reason is written into each decision Scale records; the default is
	// "scale".
	Reason string
	// Now is the clock; the default is time.Now. A simulation passes its
	// own.
	Now func() time.Time
}

const defaultAckTimeout = 10 * time.Minute

// Connector carries out decisions by writing them into a Store. It is safe
// for concurrent use as far as its Store is; one planner drives it.
type Connector struct {
	s   Store
	cfg Config
}

var _ planner.Connector = (*Connector)(nil)

// New returns a Connector over s.
func New(s Store, cfg Config) *Connector {
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = defaultAckTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Reason == "" {
		cfg.Reason = "scale"
	}
	return &Connector{s: s, cfg: cfg}
}

// Replicas reports each pool: while a decision waits for its ack, Desired
// is its target (the planner's change is in flight) and Ready the last
// acknowledged count; once acknowledged, both are the acknowledged count.
// So an outside system that runs other than what was asked (someone scaled
// by hand) shows as Desired ≠ the planner's target: a manual change.
func (c *Connector) Replicas(ctx context.Context) (map[planner.Pool]planner.Replicas, error) {
	recs, err := c.s.Latest(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[planner.Pool]planner.Replicas, len(recs)+len(c.cfg.Initial))
	for p, n := range c.cfg.Initial {
		out[p] = planner.Replicas{Desired: n, Ready: n}
	}
	for _, r := range recs {
		ready := r.AckReplicas
		if r.AckSeq == 0 {
			ready = c.cfg.Initial[r.Pool]
		}
		desired := ready
		if r.Pending() {
			desired = r.Target
		}
		out[r.Pool] = planner.Replicas{Desired: desired, Ready: ready}
	}
	return out, nil
}

// Scale writes a new decision asking for n workers in pool p. Asking
// again for the pending target does nothing. While another decision of p
// waits for its ack and is younger than AckTimeout, a decision that goes
// further the same way (more workers while more are pending, fewer while
// fewer are) supersedes it: the outside system carries out the latest
// target, and a load that keeps rising is not held back by the ack of the
// first step. One that turns back returns ErrAwaitingAck and writes
// nothing.
func (c *Connector) Scale(ctx context.Context, p planner.Pool, n int) error {
	recs, err := c.s.Latest(ctx)
	if err != nil {
		return err
	}
	now := c.cfg.Now()
	var last Record
	found := false
	for _, r := range recs {
		if r.Pool == p {
			last, found = r, true
		}
	}
	current := c.cfg.Initial[p]
	if found && last.AckSeq > 0 {
		current = last.AckReplicas
	}
	if found && last.Pending() {
		if last.Target == n {
			return nil
		}
		further := (last.Target > current && n > last.Target) || (last.Target < current && n < last.Target)
		if age := now.Sub(last.At); age < c.cfg.AckTimeout && !further {
			return fmt.Errorf("%w: pool %s decision %d (target %d) waits since %s", ErrAwaitingAck, p, last.Seq, last.Target, age.Round(time.Second))
		}
	} else if current == n {
		return nil
	}
	d := planner.Decision{
		Seq: last.Seq + 1, At: now, Pool: p, Current: current, Target: n,
		Reason: c.cfg.Reason, Mode: planner.ModeActive, Applied: true,
	}
	return c.s.Put(ctx, []planner.Decision{d})
}

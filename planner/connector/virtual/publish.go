package virtual

import (
	"context"
	"fmt"

	"github.com/kvstrata/kvstrata/planner"
)

// Publish records a planner step's decisions in s, for people and outside
// systems to read (kvctl planner status): an advisory planner's advice, or
// an active planner's changes when another connector carries them out.
// Each decision becomes its pool's next record: its Seq follows the
// record's (the planner numbers its decisions across pools, a store per
// pool), and the record's ack carries over. All or nothing; ds is not
// changed. A planner whose Connector writes into s already (active mode)
// must not publish there too, or its decisions would overtake the ones
// waiting for their ack.
//
// Two planners publishing into one store at once may race: the later Put
// of a pool's sequence number is refused (ErrStale), and the next step
// publishes again.
func Publish(ctx context.Context, s Store, ds []planner.Decision) error {
	if len(ds) == 0 {
		return nil
	}
	recs, err := s.Latest(ctx)
	if err != nil {
		return fmt.Errorf("virtual: publishing: %w", err)
	}
	seq := make(map[planner.Pool]uint64, len(recs))
	for _, r := range recs {
		seq[r.Pool] = r.Seq
	}
	out := make([]planner.Decision, len(ds))
	for i, d := range ds {
		seq[d.Pool]++
		d.Seq = seq[d.Pool]
		out[i] = d
	}
	if err := s.Put(ctx, out); err != nil {
		return fmt.Errorf("virtual: publishing: %w", err)
	}
	return nil
}

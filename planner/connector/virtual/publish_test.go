package virtual

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

func latest(t *testing.T, s Store) map[planner.Pool]Record {
	t.Helper()
	recs, err := s.Latest(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[planner.Pool]Record{}
	for _, r := range recs {
		out[r.Pool] = r
	}
	return out
}

// Publish numbers each pool's decisions on from its record, whatever the
// planner numbered them, keeps everything else, and changes nothing of
// the caller's.
func TestPublishContinuesEachPoolsSequence(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	m := NewMemory()
	step := []planner.Decision{
		{Seq: 7, At: at, Pool: planner.Prefill, Current: 1, Target: 3, Need: 2.4, Reason: planner.ReasonLoad, Mode: planner.ModeAdvisory},
		{Seq: 8, At: at, Pool: planner.Decode, Current: 2, Target: 2, Need: 1.1, Reason: planner.ReasonHold, Mode: planner.ModeAdvisory},
	}
	orig := slices.Clone(step)
	if err := Publish(ctx, m, step); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(step, orig) {
		t.Fatalf("Publish changed its argument: %+v", step)
	}
	got := latest(t, m)
	want := step[0]
	want.Seq = 1
	if got[planner.Prefill].Decision != want || got[planner.Decode].Seq != 1 || got[planner.Decode].Need != 1.1 {
		t.Fatalf("first step: %+v, want prefill %+v and decode #1", got, want)
	}
	// The decode pool has a record of its own already: a later one is #4.
	if err := m.Put(ctx, []planner.Decision{{Seq: 3, Pool: planner.Decode, Target: 2, Mode: planner.ModeActive}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx, planner.Decode, 3, 2); err != nil {
		t.Fatal(err)
	}
	step[0].Seq, step[1].Seq = 9, 10
	if err := Publish(ctx, m, step); err != nil {
		t.Fatal(err)
	}
	got = latest(t, m)
	if got[planner.Prefill].Seq != 2 || got[planner.Decode].Seq != 4 {
		t.Fatalf("second step: prefill #%d, decode #%d; want #2 and #4", got[planner.Prefill].Seq, got[planner.Decode].Seq)
	}
	if r := got[planner.Decode]; r.AckSeq != 3 || r.AckReplicas != 2 || r.Mode != planner.ModeAdvisory {
		t.Fatalf("decode after publishing over an acked record: %+v, want the ack of #3 kept", r)
	}
	if err := Publish(ctx, m, nil); err != nil {
		t.Fatalf("nothing to publish: %v", err)
	}
}

// An advisory record asks nothing of anyone: a virtual Connector over the
// same store reports the pool at its acknowledged size, not at the advice,
// and numbers its own next decision after it.
func TestPublishedAdviceIsNotAChangeInFlight(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	c := New(m, Config{Initial: map[planner.Pool]int{planner.Aggregated: 1}})
	advice := []planner.Decision{{Pool: planner.Aggregated, Current: 1, Target: 4, Need: 3.2, Reason: planner.ReasonLoad, Mode: planner.ModeAdvisory}}
	if err := Publish(ctx, m, advice); err != nil {
		t.Fatal(err)
	}
	if r := latest(t, m)[planner.Aggregated]; r.Pending() {
		t.Fatalf("advice %+v pending an ack", r)
	}
	if got := replicas(t, c)[planner.Aggregated]; got != (planner.Replicas{Desired: 1, Ready: 1}) {
		t.Fatalf("after advice of 4: %+v, want the initial 1/1", got)
	}
	if err := c.Scale(ctx, planner.Aggregated, 3); err != nil {
		t.Fatal(err)
	}
	r := latest(t, m)[planner.Aggregated]
	if r.Seq != 2 || r.Current != 1 || r.Target != 3 || r.Mode != planner.ModeActive || !r.Pending() {
		t.Fatalf("Scale after the advice: %+v, want #2 1→3 active, pending", r)
	}
}

// racing is a Store another writer writes into between Publish's Latest
// and its Put.
type racing struct {
	*Memory
	other func()
}

func (s racing) Latest(ctx context.Context) ([]Record, error) {
	recs, err := s.Memory.Latest(ctx)
	s.other()
	return recs, err
}

// A decision another writer overtook in between is refused as stale, and
// the store keeps the other writer's; a malformed one is refused, all or
// nothing.
func TestPublishRefusedChangesNothing(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	theirs := planner.Decision{Seq: 5, Pool: planner.Aggregated, Target: 2, Mode: planner.ModeActive}
	s := racing{Memory: m, other: func() {
		if err := m.Put(ctx, []planner.Decision{theirs}); err != nil {
			t.Error(err)
		}
	}}
	mine := []planner.Decision{{Pool: planner.Aggregated, Target: 6, Mode: planner.ModeAdvisory}}
	if err := Publish(ctx, s, mine); !errors.Is(err, ErrStale) {
		t.Fatalf("publishing over a newer record: %v, want ErrStale", err)
	}
	if r := latest(t, m)[planner.Aggregated]; r.Decision != theirs {
		t.Fatalf("after the refusal: %+v, want the other writer's %+v", r, theirs)
	}
	bad := []planner.Decision{{Pool: planner.Decode, Target: 1}, {Pool: "gpu", Target: 1}}
	if err := Publish(ctx, m, bad); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an unknown pool: %v, want ErrInvalid", err)
	}
	if _, ok := latest(t, m)[planner.Decode]; ok {
		t.Fatal("a refused publication recorded the decode pool's decision")
	}
}

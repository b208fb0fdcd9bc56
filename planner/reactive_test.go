package planner

import (
	"context"
	"errors"
	"testing"
)

// reactivePool is a Connector over one pool whose workers are ready as soon as
// they are asked for, unless starting is set.
type reactivePool struct {
	desired, ready int
	starting       bool
	scaled         []int
}

func (p *reactivePool) Replicas(context.Context) (map[Pool]Replicas, error) {
	return map[Pool]Replicas{Aggregated: {Desired: p.desired, Ready: p.ready}}, nil
}

func (p *reactivePool) Scale(_ context.Context, _ Pool, n int) error {
	p.desired = n
	if !p.starting || n < p.ready {
		p.ready = n
	}
	p.scaled = append(p.scaled, n)
	return nil
}

func TestReactiveMovesOneWorkerAtATimeOnItsThresholds(t *testing.T) {
	c := &reactivePool{desired: 2, ready: 2}
	r, err := NewReactive(ReactiveConfig{Limits: Limits{Min: 1, Max: 3}}, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, step := range []struct {
		queue, kv float64
		ok        bool
		want      int
	}{
		{queue: 11, ok: true, want: 3},          // 5.5 waiting a worker > 5: up one
		{queue: 30, ok: true, want: 3},          // at the maximum
		{queue: 0, kv: 0.95, ok: true, want: 3}, // KV full, still at the maximum
		{queue: 0, kv: 0.6, ok: true, want: 3},  // between the thresholds: hold
		{queue: 0, kv: 0.2, ok: false, want: 3}, // a failed scrape is not idleness
		{queue: 0, kv: 0.2, ok: true, want: 2},  // both low: down one
		{queue: 0, kv: 0.2, ok: true, want: 1},
		{queue: 0, kv: 0, ok: true, want: 1}, // at the minimum
	} {
		d, err := r.Step(ctx, Observation{OK: step.ok, QueueDepth: step.queue}, step.kv)
		if err != nil {
			t.Fatal(err)
		}
		if c.desired != step.want || d.Target != step.want {
			t.Fatalf("step %d (queue %v, kv %v, ok %v): %d workers, decision %+v; want %d", i, step.queue, step.kv, step.ok, c.desired, d, step.want)
		}
	}
	if len(c.scaled) != 3 {
		t.Errorf("scaled %v, want three changes of one worker", c.scaled)
	}
}

func TestReactiveWaitsForAChangeToStart(t *testing.T) {
	c := &reactivePool{desired: 1, ready: 1, starting: true}
	r, err := NewReactive(ReactiveConfig{Limits: Limits{Max: 8}}, c)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.Step(context.Background(), Observation{OK: true, QueueDepth: 100}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if c.desired != 2 {
		t.Fatalf("%d workers asked for while the second was still starting, want 2", c.desired)
	}
}

func TestReactiveRefusesBadThresholds(t *testing.T) {
	_, err := NewReactive(ReactiveConfig{Limits: Limits{Min: 2, Max: 1}, QueueUp: 1, QueueDown: 2}, &reactivePool{})
	if !errors.Is(err, ErrReactiveConfig) {
		t.Fatalf("err %v, want ErrReactiveConfig", err)
	}
}

package virtual

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

// clock is a settable clock for the ack timeout.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func replicas(t *testing.T, c *Connector) map[planner.Pool]planner.Replicas {
	t.Helper()
	r, err := c.Replicas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestConnectorHandshake(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)}
	m := NewMemory()
	c := New(m, Config{Initial: map[planner.Pool]int{planner.Aggregated: 2}, Now: clk.now})

	if got := replicas(t, c)[planner.Aggregated]; got != (planner.Replicas{Desired: 2, Ready: 2}) {
		t.Fatalf("before any decision: %+v, want the initial 2/2", got)
	}
	if err := c.Scale(ctx, planner.Aggregated, 2); err != nil {
		t.Fatal(err)
	}
	if recs, _ := m.Latest(ctx); len(recs) != 0 {
		t.Fatalf("scaling to the current size wrote %+v", recs)
	}
	if err := c.Scale(ctx, planner.Aggregated, 4); err != nil {
		t.Fatal(err)
	}
	recs, _ := m.Latest(ctx)
	if len(recs) != 1 || recs[0].Seq != 1 || recs[0].Target != 4 || recs[0].Current != 2 || !recs[0].Pending() {
		t.Fatalf("after Scale(4): %+v", recs)
	}
	// In flight: desired is the target, ready what was acknowledged.
	if got := replicas(t, c)[planner.Aggregated]; got != (planner.Replicas{Desired: 4, Ready: 2}) {
		t.Fatalf("pending: %+v, want 4/2", got)
	}
	// The same target again is no new decision; one that turns back waits
	// for the ack; one that goes further the same way supersedes it.
	if err := c.Scale(ctx, planner.Aggregated, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(ctx, planner.Aggregated, 3); !errors.Is(err, ErrAwaitingAck) {
		t.Fatalf("turning back before the ack: %v, want ErrAwaitingAck", err)
	}
	if err := c.Scale(ctx, planner.Aggregated, 5); err != nil {
		t.Fatalf("going further before the ack: %v", err)
	}
	recs, _ = m.Latest(ctx)
	if recs[0].Seq != 2 || recs[0].Current != 2 || recs[0].Target != 5 || !recs[0].Pending() {
		t.Fatalf("after Scale(5) superseded Scale(4): %+v", recs[0])
	}
	if err := m.Ack(ctx, planner.Aggregated, 2, 5); err != nil {
		t.Fatal(err)
	}
	if got := replicas(t, c)[planner.Aggregated]; got != (planner.Replicas{Desired: 5, Ready: 5}) {
		t.Fatalf("acked: %+v, want 5/5", got)
	}
	if err := c.Scale(ctx, planner.Aggregated, 3); err != nil {
		t.Fatal(err)
	}
	recs, _ = m.Latest(ctx)
	if recs[0].Seq != 3 || recs[0].Current != 5 || recs[0].Target != 3 {
		t.Fatalf("after the ack, Scale(3): %+v", recs[0])
	}
	// No ack: after AckTimeout the next change replaces the decision.
	clk.t = clk.t.Add(defaultAckTimeout - time.Second)
	if err := c.Scale(ctx, planner.Aggregated, 4); !errors.Is(err, ErrAwaitingAck) {
		t.Fatalf("just before the ack timeout: %v, want ErrAwaitingAck", err)
	}
	clk.t = clk.t.Add(time.Second)
	if err := c.Scale(ctx, planner.Aggregated, 4); err != nil {
		t.Fatalf("at the ack timeout: %v", err)
	}
	recs, _ = m.Latest(ctx)
	if recs[0].Seq != 4 || recs[0].Target != 4 || recs[0].AckSeq != 2 || recs[0].AckReplicas != 5 {
		t.Fatalf("after the timeout: %+v", recs[0])
	}
}

// An outside system that runs other than what it was asked shows as a
// desired count different from the planner's target: a manual change.
func TestConnectorManualAck(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	c := New(m, Config{})
	if err := c.Scale(ctx, planner.Decode, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx, planner.Decode, 1, 5); err != nil {
		t.Fatal(err)
	}
	if got := replicas(t, c)[planner.Decode]; got != (planner.Replicas{Desired: 5, Ready: 5}) {
		t.Fatalf("acked with 5 for a target of 2: %+v, want 5/5", got)
	}
}

func TestMemoryRejects(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	ok := planner.Decision{Seq: 3, Pool: planner.Prefill, Target: 2}
	if err := m.Put(ctx, []planner.Decision{ok}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		ds   []planner.Decision
		want error
	}{
		{"unknown pool", []planner.Decision{{Seq: 4, Pool: "gpu", Target: 1}}, ErrInvalid},
		{"negative target", []planner.Decision{{Seq: 4, Pool: planner.Prefill, Target: -1}}, ErrInvalid},
		{"seq 0", []planner.Decision{{Pool: planner.Prefill, Target: 1}}, ErrInvalid},
		{"long reason", []planner.Decision{{Seq: 4, Pool: planner.Prefill, Reason: strings.Repeat("x", MaxField+1)}}, ErrInvalid},
		{"older seq", []planner.Decision{{Seq: 2, Pool: planner.Prefill, Target: 7}}, ErrStale},
		{"one bad of two", []planner.Decision{{Seq: 4, Pool: planner.Decode, Target: 1}, {Seq: 1, Pool: planner.Prefill}}, ErrStale},
	} {
		if err := m.Put(ctx, tc.ds); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, tc := range []struct {
		name     string
		pool     planner.Pool
		seq      uint64
		replicas int
		want     error
	}{
		{"unknown pool", "gpu", 3, 1, ErrInvalid},
		{"negative", planner.Prefill, 3, -1, ErrInvalid},
		{"future seq", planner.Prefill, 4, 1, ErrStale},
		{"no record", planner.Decode, 1, 1, ErrStale},
	} {
		if err := m.Ack(ctx, tc.pool, tc.seq, tc.replicas); !errors.Is(err, tc.want) {
			t.Errorf("ack %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	recs, _ := m.Latest(ctx)
	if len(recs) != 1 || recs[0].Decision != ok || recs[0].AckSeq != 0 {
		t.Fatalf("rejected input changed the store: %+v", recs)
	}
	if err := m.Ack(ctx, planner.Prefill, 3, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(ctx, planner.Prefill, 2, 2); !errors.Is(err, ErrStale) {
		t.Fatalf("ack older than the last ack: %v, want ErrStale", err)
	}
}

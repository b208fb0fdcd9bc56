package transfertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Draining: a listener that is a transfer.Drainer stops taking
// connections, closes idle ones at once, and lets a request being served
// finish before Shutdown returns — or cuts it at Shutdown's deadline.

func drainer(t *testing.T, e *env) transfer.Drainer {
	t.Helper()
	d, ok := e.ln.(transfer.Drainer)
	if !ok {
		t.Skipf("%s listeners have no graceful Shutdown (transfer.Drainer)", e.tr.Name())
	}
	return d
}

func testDrainFinishesRequestsInFlight(t *testing.T, f Factory) {
	setup, reached, release := stall(Key(1))
	e := start(t, f, setup)
	t.Cleanup(release)
	d := drainer(t, e)
	blocks := makeBlocks(1, 1, func(int) int { return 64 << 10 })
	e.seed(blocks...)
	busy, idle := e.dial(), e.dial()
	got := make(chan error, 1)
	col := NewCollector(1)
	go func() { got <- busy.Get(e.ctx(), []index.Key{Key(1)}, col) }()
	<-reached
	drained := make(chan error, 1)
	go func() { drained <- d.Shutdown(e.ctx()) }()
	waitRefused(t, e)
	// The idle connection serves nothing more.
	if err := idle.Get(e.ctx(), []index.Key{Key(1)}, NewCollector(1)); err == nil {
		t.Fatal("a request on an idle connection went through a draining listener")
	}
	select {
	case err := <-drained:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-got; err != nil || col.Reported() != 1 {
		t.Fatalf("the Get in flight during the drain: %v (%d blocks)", err, col.Reported())
	}
	wantBlocks(t, col, blocks)
	if err := <-drained; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// waitRefused waits until the listener takes no new connection: the drain
// has begun.
func waitRefused(t *testing.T, e *env) {
	t.Helper()
	for deadline := time.Now().Add(opTimeout); ; time.Sleep(5 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := e.tr.Dial(ctx, e.ln.Addr())
		cancel()
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still takes connections during Shutdown")
		}
	}
}

func testDrainGivesUpAtTheDeadline(t *testing.T, f Factory) {
	setup, reached, release := stall(Key(1))
	e := start(t, f, setup)
	d := drainer(t, e)
	e.seed(makeBlocks(1, 1, func(int) int { return 1000 })...)
	c := e.dial()
	go c.Get(e.ctx(), []index.Key{Key(1)}, NewCollector(1))
	<-reached
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	time.AfterFunc(300*time.Millisecond, release) // the Open returns after the deadline
	if err := d.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown past its deadline: %v", err)
	}
}

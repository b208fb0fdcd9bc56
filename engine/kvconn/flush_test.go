package kvconn

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/internal/hung"
)

// Once Flush returns, every block offloaded before it is in the cache: a
// Lookup right after finds all of them, with nothing dropped.
func TestFlushWaitsUntilEveryOffloadIsStored(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	c, _ := newConn(t, n.Addr, func(cfg *Config) { cfg.OffloadBatch = 4 })
	var ps []prompt
	for i := range 5 {
		p := newPrompt(7, uint64(10+i), 12)
		ps = append(ps, p)
		c.Offload(p.ns, p.blocks(0, 12))
	}
	dropped, err := c.Flush(ctx5(t))
	if err != nil || dropped != 0 {
		t.Fatalf("Flush = %d, %v; want 0 dropped and no error", dropped, err)
	}
	for i, p := range ps {
		if held, err := c.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != 12 {
			t.Fatalf("prompt %d: Lookup right after Flush = %d, %v; want all 12 blocks", i, held, err)
		}
	}
	// Nothing waiting: Flush returns at once, even with its time up.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if dropped, err := c.Flush(ctx); err != nil || dropped != 0 {
		t.Fatalf("Flush of an empty queue = %d, %v; want 0, nil", dropped, err)
	}
}

// With the cache node hung, Flush returns when its context ends, with
// the blocks still waiting counted as dropped and the context's error;
// blocks dropped before it (over the queue bound) are not its count but
// Dropped's.
func TestFlushReturnsAtItsDeadlineWhenTheNodeHangs(t *testing.T) {
	const bound = 6
	c, _ := newConn(t, hung.Listener(t), func(cfg *Config) {
		cfg.OffloadQueueBytes = bound * blockSize
		cfg.OffloadTimeout = 200 * time.Millisecond
		cfg.CloseTimeout = 100 * time.Millisecond
	})
	p := newPrompt(7, 3, 10)
	c.Offload(p.ns, p.blocks(0, 10))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	var dropped int
	var err error
	go func() {
		defer close(done)
		dropped, err = c.Flush(ctx)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Flush still waiting a minute after its 500ms deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) || dropped != bound {
		t.Fatalf("Flush = %d, %v; want the %d queued blocks and context.DeadlineExceeded", dropped, err, bound)
	}
	if got := c.Dropped(); got != 10-bound {
		t.Fatalf("Dropped = %d, want the %d over the bound", got, 10-bound)
	}
}

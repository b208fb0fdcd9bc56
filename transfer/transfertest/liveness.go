package transfertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Liveness: a server that stalls, dies or restarts costs the client an
// error within its deadline, never a hang, and a redial brings it back.

// stall makes Open of key block until release is called, and closes reached
// when it first blocks. Register release with t.Cleanup after start, so that
// it runs before the listener's Close, which waits for the blocked Open.
func stall(key index.Key) (setup func(*Memory), reached <-chan struct{}, release func()) {
	unblock, hit := make(chan struct{}), make(chan struct{})
	var hitOnce, releaseOnce sync.Once
	setup = func(m *Memory) {
		m.OnOpen = func(k index.Key) error {
			if k == key {
				hitOnce.Do(func() { close(hit) })
				<-unblock
			}
			return nil
		}
	}
	return setup, hit, func() { releaseOnce.Do(func() { close(unblock) }) }
}

func testStalledDeadline(t *testing.T, f Factory) {
	testStalled(t, f, context.DeadlineExceeded, func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, 300*time.Millisecond)
	})
}

func testStalledCancel(t *testing.T, f Factory) {
	testStalled(t, f, context.Canceled, func(ctx context.Context) (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(300*time.Millisecond, cancel)
		return ctx, cancel
	})
}

// testStalled gets blocks one of which the server cannot open, under a ctx
// made by bound, and wants the Get to fail with want soon after the ctx
// ends; the node still serves other connections meanwhile.
func testStalled(t *testing.T, f Factory, want error, bound func(context.Context) (context.Context, context.CancelFunc)) {
	setup, _, release := stall(Key(3))
	e := start(t, f, setup)
	t.Cleanup(release)
	blocks := makeBlocks(1, 4, func(int) int { return 64 << 10 })
	e.seed(blocks...)
	c := e.dial()
	ctx, cancel := bound(context.Background())
	defer cancel()
	began := time.Now()
	err := c.Get(ctx, keysOf(blocks), NewCollector(len(blocks)))
	took := time.Since(began)
	if !errors.Is(err, want) {
		t.Fatalf("Get from a stalled server = %v, want %v", err, want)
	}
	if took > 300*time.Millisecond+failFast {
		t.Errorf("Get took %v to notice its ctx ended after 300ms", took)
	}
	wantClosed(t, e, c)
	// Another connection is served while the stalled Open still blocks.
	other := blocks[3:]
	wantBlocks(t, e.get(e.dial(), keysOf(other)), other)
}

func testClosedBetweenBlocks(t *testing.T, f Factory) {
	setup, reached, release := stall(Key(9))
	e := start(t, f, setup)
	t.Cleanup(release)
	blocks := makeBlocks(1, 16, func(int) int { return 256 << 10 })
	e.seed(blocks...)
	c := e.dial()
	closed := make(chan error, 1)
	go func() {
		<-reached
		closed <- e.ln.Close() // returns once release lets the Open go
	}()
	col := NewCollector(len(blocks))
	began := time.Now()
	err := c.Get(e.ctx(), keysOf(blocks), col)
	took := time.Since(began)
	release()
	if err == nil {
		t.Fatal("Get from a server closed mid-transfer succeeded")
	}
	if took > failFast {
		t.Errorf("Get took %v to fail after the server closed", took)
	}
	if err := <-closed; err != nil {
		t.Errorf("Listener.Close: %v", err)
	}
	wantPrefix(t, col, blocks, 8) // block 8 (key 9) never left the server
	wantClosed(t, e, c)
}

func testClosedMidPayload(t *testing.T, f Factory) {
	setup, _, release := stall(Key(16))
	e := start(t, f, setup)
	t.Cleanup(release)
	blocks := makeBlocks(1, 16, func(int) int { return SuiteLimits.MaxBlockSize })
	e.seed(blocks...)
	c := e.dial()
	// The server closes as the client starts on block 1's bytes, with 4 MiB
	// blocks in flight behind them; the last block waits on a stalled Open,
	// so the Get cannot complete however much the socket buffers hold.
	closed := make(chan error, 1)
	col := &closingCollector{Collector: NewCollector(len(blocks)), at: 1, close: func() {
		go func() { closed <- e.ln.Close() }()
	}}
	began := time.Now()
	err := c.Get(e.ctx(), keysOf(blocks), col)
	took := time.Since(began)
	release()
	if err == nil {
		t.Fatal("Get from a server closed mid-transfer succeeded")
	}
	if took > failFast {
		t.Errorf("Get took %v to fail after the server closed", took)
	}
	if err := <-closed; err != nil {
		t.Errorf("Listener.Close: %v", err)
	}
	wantPrefix(t, col.Collector, blocks, len(blocks)-1)
	wantClosed(t, e, c)
}

// closingCollector calls close when Buffer is asked for block at.
type closingCollector struct {
	*Collector
	at    int
	close func()
}

func (c *closingCollector) Buffer(i int, h index.Header) []byte {
	if i == c.at {
		c.close()
	}
	return c.Collector.Buffer(i, h)
}

// wantPrefix checks what a failed Get reported: at most limit blocks, in
// order, each intact.
func wantPrefix(t *testing.T, col *Collector, blocks []transfer.Block, limit int) {
	t.Helper()
	for _, p := range col.Problems {
		t.Errorf("Receiver contract: %s", p)
	}
	if col.Reported() > limit {
		t.Errorf("a Get cut off before block %d reported %d blocks", limit, col.Reported())
	}
	wantBlocks(t, col, blocks[:min(col.Reported(), len(blocks))])
}

// wantClosed checks that a Conn that failed mid-request refuses the next
// one with ErrClosed.
func wantClosed(t *testing.T, e *env, c transfer.Conn) {
	t.Helper()
	err := c.Get(e.ctx(), []index.Key{Key(1)}, NewCollector(1))
	if !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("Get on a Conn that failed = %v, want ErrClosed", err)
	}
	if _, err := c.Put(e.ctx(), []transfer.Block{MakeBlock(1, 1)}); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("Put on a Conn that failed = %v, want ErrClosed", err)
	}
}

func testReconnect(t *testing.T, f Factory) {
	e := start(t, f, nil)
	blocks := makeBlocks(1, 2, func(int) int { return 1 << 10 })
	e.seed(blocks...)
	c := e.dial()
	wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
	addr := e.ln.Addr()
	if err := e.ln.Close(); err != nil {
		t.Fatalf("Listener.Close: %v", err)
	}
	if err := c.Get(e.ctx(), keysOf(blocks), NewCollector(len(blocks))); err == nil {
		t.Fatal("Get over a connection the server closed succeeded")
	}
	wantClosed(t, e, c)
	// While nothing listens, a Dial says the node is unavailable: a
	// caller may try again, as it may not after a refusal.
	if c, err := e.tr.Dial(e.ctx(), addr); !errors.Is(err, transfer.ErrUnavailable) || errors.Is(err, transfer.ErrRefused) {
		if err == nil {
			_ = c.Close()
		}
		t.Fatalf("Dial while nothing listens = %v, want ErrUnavailable", err)
	}
	e.listen(addr)
	c = e.dial()
	wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
}

func testClosed(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	if err := c.Close(); err != nil {
		t.Errorf("Conn.Close: %v", err)
	}
	wantClosed(t, e, c)
	_ = c.Close() // a second Close neither panics nor blocks

	addr := e.ln.Addr()
	if err := e.ln.Close(); err != nil {
		t.Errorf("Listener.Close: %v", err)
	}
	if err := e.ln.Close(); err != nil {
		t.Errorf("a second Listener.Close: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), failFast)
	defer cancel()
	if c, err := e.tr.Dial(ctx, addr); err == nil {
		_ = c.Close()
		t.Error("Dial to a closed listener succeeded")
	}
}

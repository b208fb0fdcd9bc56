package transfertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Faults: bad bytes, requests over the limits, and servers that stall, die
// or restart. Bad bytes are never delivered as good; a client never hangs.

// failFast bounds how long a request may take to fail once its cause (a
// deadline, a closed connection) is there; generous for the race detector.
const failFast = 5 * time.Second

func testCorruptFromServer(t *testing.T, f Factory) {
	bad := Key(2)
	e := start(t, f, func(m *Memory) {
		m.Tamper = func(k index.Key, data []byte) []byte {
			if k == bad {
				return flipped(data)
			}
			return data
		}
	})
	c := e.dial()
	blocks := makeBlocks(1, 3, func(i int) int { return []int{4096, 64 << 10, 100}[i] })
	e.seed(blocks...)
	col := e.get(c, keysOf(blocks))
	if !errors.Is(col.Errs[1], transfer.ErrCorrupt) {
		t.Errorf("tampered block: err = %v, want ErrCorrupt", col.Errs[1])
	}
	wantBlocks(t, col, []transfer.Block{blocks[0]})
	wantBlocks(t, e.get(c, keysOf(blocks[2:])), blocks[2:])
}

func testCorruptPut(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	blocks := makeBlocks(1, 3, func(i int) int { return 10_000 + i })
	blocks[1].Sum ^= 1
	errs, err := c.Put(e.ctx(), blocks)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if !errors.Is(errs[1], transfer.ErrCorrupt) {
		t.Errorf("block with a wrong Sum: err = %v, want ErrCorrupt", errs[1])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("good blocks: errs = %v, %v", errs[0], errs[2])
	}
	if _, ok := e.mem.Block(blocks[1].Key); ok {
		t.Error("the block with a wrong Sum was stored")
	}
	wantStored(t, e.mem, []transfer.Block{blocks[0], blocks[2]})
}

func testHandlerErrors(t *testing.T, f Factory) {
	full, unreadable := Key(2), Key(5)
	e := start(t, f, func(m *Memory) {
		m.OnReserve = func(h index.Header) error {
			if h.Key == full {
				return errors.New("memory: store is full")
			}
			return nil
		}
		m.OnOpen = func(k index.Key) error {
			if k == unreadable {
				return errors.New("memory: disk read failed")
			}
			return nil
		}
	})
	c := e.dial()
	blocks := makeBlocks(1, 3, func(i int) int { return 5000 })
	errs, err := c.Put(e.ctx(), blocks)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "store is full") {
		t.Errorf("block the store refused: err = %v, want the handler's error", errs[1])
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("other blocks: errs = %v, %v", errs[0], errs[2])
	}
	wantStored(t, e.mem, []transfer.Block{blocks[0], blocks[2]})

	served := makeBlocks(4, 3, func(int) int { return 3000 })
	e.seed(served...)
	col := e.get(c, keysOf(served))
	if col.Errs[1] == nil || !strings.Contains(col.Errs[1].Error(), "disk read failed") {
		t.Errorf("block the handler failed to open: err = %v, want the handler's error", col.Errs[1])
	}
	wantBlocks(t, col, served[:1])
	wantBlocks(t, e.get(c, keysOf(served[2:])), served[2:])
}

func testPutOverSize(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	sizes := []int{1 << 10, 2 << 10, SuiteLimits.MaxBlockSize + 1<<20, 3 << 10}
	blocks := makeBlocks(1, len(sizes), func(i int) int { return sizes[i] })
	errs, err := c.Put(e.ctx(), blocks)
	wantRefused(t, e, errs, err, "block 2")
	stillServes(t, e, c)
}

func testPutOverCount(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	blocks := makeBlocks(1, SuiteLimits.MaxBlocks+1, func(int) int { return 1 })
	errs, err := c.Put(e.ctx(), blocks)
	wantRefused(t, e, errs, err, fmt.Sprint(len(blocks)))
	stillServes(t, e, c)
}

func testGetOverCount(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	keys := make([]index.Key, SuiteLimits.MaxBlocks+1)
	for i := range keys {
		keys[i] = Key(index.Hash(i))
	}
	col := NewCollector(len(keys))
	err := c.Get(e.ctx(), keys, col)
	if !errors.Is(err, transfer.ErrRefused) {
		t.Errorf("Get of %d keys: err = %v, want ErrRefused", len(keys), err)
	}
	if col.Reported() != 0 {
		t.Errorf("a refused Get reported %d blocks", col.Reported())
	}
	stillServes(t, e, c)
}

// wantRefused checks that a Put was refused as a whole, with a message that
// names the problem, and that nothing of it was applied.
func wantRefused(t *testing.T, e *env, errs []error, err error, mention string) {
	t.Helper()
	if !errors.Is(err, transfer.ErrRefused) || errs != nil {
		t.Fatalf("Put over a limit = %v, %v; want ErrRefused and no per-block errors", errs, err)
	}
	if !strings.Contains(err.Error(), mention) {
		t.Errorf("refusal %q does not mention %q", err, mention)
	}
	if n := e.mem.Reserves(); n != 0 {
		t.Errorf("the server reserved %d blocks of a refused put", n)
	}
	if n := e.mem.Len(); n != 0 {
		t.Errorf("the server stored %d blocks of a refused put", n)
	}
}

// stillServes checks that, after a refusal, the Conn either carries the
// next request or reports ErrClosed, and that a new Conn works then.
func stillServes(t *testing.T, e *env, c transfer.Conn) {
	t.Helper()
	b := MakeBlock(99, 100)
	errs, err := c.Put(e.ctx(), []transfer.Block{b})
	if errors.Is(err, transfer.ErrClosed) {
		c = e.dial()
		errs, err = c.Put(e.ctx(), []transfer.Block{b})
	}
	if err != nil || errs[0] != nil {
		t.Fatalf("Put after a refusal = %v, %v", errs, err)
	}
	wantBlocks(t, e.get(c, []index.Key{b.Key}), []transfer.Block{b})
}

// testConnectionLimit: a listener at its connection limit turns the next
// one away with ErrUnavailable naming the limit (try again later; not
// ErrRefused, which says the request itself is wrong), keeps serving the
// others, and takes a new one once one closes.
func testConnectionLimit(t *testing.T, f Factory) {
	lim := SuiteLimits
	lim.MaxConns = 2
	tr := f.New(t, lim)
	mem := NewMemory()
	mem.Store(MakeBlock(1, 1000))
	ln := Listen(t, tr, mem)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	conns := []transfer.Conn{Dial(t, tr, ln.Addr()), Dial(t, tr, ln.Addr())}
	if _, err := tr.Dial(ctx, ln.Addr()); !errors.Is(err, transfer.ErrUnavailable) || errors.Is(err, transfer.ErrRefused) ||
		!strings.Contains(err.Error(), "limit of 2") {
		t.Fatalf("Dial over the limit = %v, want ErrUnavailable naming the limit of 2", err)
	}
	if err := conns[1].Get(ctx, []index.Key{Key(1)}, NewCollector(1)); err != nil {
		t.Errorf("Get within the limit: %v", err)
	}
	_ = conns[0].Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		c, err := tr.Dial(ctx, ln.Addr())
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Dial after a connection closed: %v", err)
		}
	}
}

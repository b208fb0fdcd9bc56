package kvconn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/nodetest"
)

// cacheDown reports whether err says the cache could not be reached in
// time.
func cacheDown(err error) bool {
	return errors.Is(err, client.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// A worker whose cache is not there yet gets errors from Lookup and Load
// within their contexts, never waits in Offload, which keeps what its
// bound allows and drops the rest; once a node listens at the address,
// the queued blocks are offloaded and served.
func TestCacheDownThenUp(t *testing.T) {
	addr := freeAddr(t)
	const bound = 4
	c, reg := newConn(t, addr, func(cfg *Config) { cfg.OffloadQueueBytes = bound * blockSize })
	p := newPrompt(5, 7, 10)

	if held, err := c.Lookup(ctx5(t), p.ns, p.hashes); held != 0 || !cacheDown(err) {
		t.Fatalf("Lookup with no cache = %d, %v; want 0 and client.ErrUnavailable", held, err)
	}
	if loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, newPool(10).dst); loaded != 0 || !cacheDown(err) {
		t.Fatalf("Load with no cache = %d, %v; want 0 and client.ErrUnavailable", loaded, err)
	}
	c.Offload(p.ns, p.blocks(0, 10)) // returns at once: the test would hang otherwise
	if got := metric(t, reg, "kvstrata_engine_offload_dropped_blocks_total"); got != 10-bound {
		t.Fatalf("dropped %v blocks, want the %d over the %d-block bound", got, 10-bound, bound)
	}
	for _, op := range []string{"lookup", "load"} {
		if got := metric(t, reg, "kvstrata_engine_cache_errors_total", "op", op); got != 1 {
			t.Fatalf("%s errors %v, want 1", op, got)
		}
	}

	startStoppable(t, addr)
	eventually(t, "the queued blocks offloaded once the node is up", func() bool {
		return metric(t, reg, "kvstrata_engine_offload_blocks_total") == bound
	})
	if held, err := c.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != bound {
		t.Fatalf("Lookup = %d, %v; want %d", held, err, bound)
	}
	dst := newPool(10)
	if loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst); err != nil || loaded != bound {
		t.Fatalf("Load = %d, %v; want %d", loaded, err, bound)
	}
	checkLoaded(t, dst, p, bound)
}

// A node that goes away and comes back on its address (empty, as a
// restarted DRAM node is) is used again by the same Conn.
func TestNodeRestart(t *testing.T) {
	n := startStoppable(t, freeAddr(t))
	c, reg := newConn(t, n.Addr, nil)
	p := newPrompt(5, 8, 6)
	if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(0, 3)); err != nil {
		t.Fatal(err)
	}

	n.Stop()
	if _, err := c.Lookup(ctx5(t), p.ns, p.hashes); !cacheDown(err) {
		t.Fatalf("Lookup of a stopped node: %v, want client.ErrUnavailable", err)
	}
	if loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, newPool(6).dst); loaded != 0 || !cacheDown(err) {
		t.Fatalf("Load of a stopped node = %d, %v; want 0 and client.ErrUnavailable", loaded, err)
	}
	c.Offload(p.ns, p.blocks(0, 6))

	n.Start()
	eventually(t, "the blocks queued while the node was down offloaded", func() bool {
		return metric(t, reg, "kvstrata_engine_offload_blocks_total") == 3+6
	})
	dst := newPool(6)
	if loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst); err != nil || loaded != 6 {
		t.Fatalf("Load after the restart = %d, %v; want 6", loaded, err)
	}
	checkLoaded(t, dst, p, 6)
	if got := metric(t, reg, "kvstrata_engine_offload_dropped_blocks_total"); got != 0 {
		t.Fatalf("dropped %v blocks, want none: the queue had room", got)
	}
}

// Close offloads what is queued before it closes the connections; an
// Offload after Close is dropped.
func TestCloseFlushes(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	c, reg := newConn(t, n.Addr, func(cfg *Config) { cfg.OffloadBatch, cfg.CloseTimeout = 4, time.Minute })
	p := newPrompt(5, 9, 20)
	c.Offload(p.ns, p.blocks(0, 20))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, reg, "kvstrata_engine_offload_blocks_total"); got != 20 {
		t.Fatalf("offloaded %v blocks by Close, want 20", got)
	}
	c.Offload(p.ns, p.blocks(0, 1))
	if got := metric(t, reg, "kvstrata_engine_offload_dropped_blocks_total"); got != 1 {
		t.Fatalf("dropped %v blocks, want the one offered after Close", got)
	}
	if _, err := c.Lookup(ctx5(t), p.ns, p.hashes); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lookup after Close: %v, want ErrClosed", err)
	}

	reader, _ := newConn(t, n.Addr, nil)
	if held, err := reader.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != 20 {
		t.Fatalf("Lookup from another Conn = %d, %v; want 20", held, err)
	}
}

// With the cache down, Close gives up on the queue when its time is up
// and counts what it dropped.
func TestCloseGivesUpWhenCacheDown(t *testing.T) {
	c, reg := newConn(t, freeAddr(t), func(cfg *Config) { cfg.CloseTimeout = 1 })
	p := newPrompt(5, 10, 3)
	c.Offload(p.ns, p.blocks(0, 3))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := metric(t, reg, "kvstrata_engine_offload_dropped_blocks_total"); got != 3 {
		t.Fatalf("dropped %v blocks, want 3", got)
	}
}

// A Config is checked whole: every bad field is named.
func TestConfigValidate(t *testing.T) {
	cfg := Config{OffloadBatch: -1, Backoff: -1, OffloadQueueBytes: -5}
	cfg.EnsureDefaults()
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate: %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"Addr", "OffloadBatch", "Backoff", "OffloadQueueBytes"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("the error does not name %s: %v", field, err)
		}
	}
	if _, err := New(context.Background(), Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with no Addr: %v, want ErrInvalidConfig", err)
	}
}

// A node found unreachable is left alone for the backoff: Lookup, Load
// and Store fail at once with ErrCacheDown, even once it is back, until
// the offloader's next try finds it answering.
func TestBackoffAfterCacheDown(t *testing.T) {
	addr := freeAddr(t)
	c, _ := newConn(t, addr, func(cfg *Config) { cfg.Backoff, cfg.MaxBackoff = time.Hour, time.Hour })
	p := newPrompt(5, 11, 2)

	// New found nothing at addr.
	if _, err := c.Lookup(ctx5(t), p.ns, p.hashes); !errors.Is(err, ErrCacheDown) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Lookup: %v, want ErrCacheDown and client.ErrUnavailable", err)
	}
	startStoppable(t, addr)
	if _, err := c.Load(ctx5(t), "", p.ns, p.hashes, newPool(2).dst); !errors.Is(err, ErrCacheDown) {
		t.Fatalf("Load within the backoff: %v, want ErrCacheDown", err)
	}
	if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(0, 1)); !errors.Is(err, ErrCacheDown) {
		t.Fatalf("Store within the backoff: %v, want ErrCacheDown", err)
	}

	c.Offload(p.ns, p.blocks(0, 2)) // its first try goes through
	eventually(t, "Lookup answered after the offloader found the node", func() bool {
		held, err := c.Lookup(ctx5(t), p.ns, p.hashes)
		return err == nil && held == 2
	})
}

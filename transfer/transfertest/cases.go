package transfertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// The data path: what goes in comes out, whole, in order, for every shape of
// request a node sees.

func testRoundTrip(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	sizes := []int{1, 100, 4095, 4096, 64 << 10, 1<<20 + 3, 0}
	blocks := makeBlocks(1, len(sizes), func(i int) int { return sizes[i] })
	e.put(c, blocks)
	wantStored(t, e.mem, blocks)
	wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
}

func testZeroLength(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	b := MakeBlock(7, 0)
	e.put(c, []transfer.Block{b})
	wantStored(t, e.mem, []transfer.Block{b})
	col := e.get(c, []index.Key{b.Key})
	wantBlocks(t, col, []transfer.Block{b})
	if col.Errs[0] == nil && len(col.Data[0]) != 0 {
		t.Errorf("zero-length block came back with %d bytes", len(col.Data[0]))
	}
}

func testManyBlocks(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	blocks := makeBlocks(1000, 500, func(i int) int { return 1 + (i*7919)%(8<<10) })
	e.put(c, blocks)
	wantStored(t, e.mem, blocks)
	wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
}

func testLargestBlocks(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	blocks := makeBlocks(1, 4, func(int) int { return SuiteLimits.MaxBlockSize })
	e.put(c, blocks)
	wantStored(t, e.mem, blocks)
	wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
}

func testEmptyRequests(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	errs, err := c.Put(e.ctx(), nil)
	if err != nil || len(errs) != 0 {
		t.Errorf("Put of no blocks = %v, %v; want no errors", errs, err)
	}
	e.get(c, nil)
	// The connection still works.
	b := MakeBlock(1, 10)
	e.put(c, []transfer.Block{b})
	wantBlocks(t, e.get(c, []index.Key{b.Key}), []transfer.Block{b})
}

func testMissingKeys(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	present := makeBlocks(1, 4, func(i int) int { return 1000 * (i + 1) })
	e.seed(present...)
	keys := []index.Key{Key(900), present[0].Key, present[1].Key, Key(901), Key(902), present[2].Key, present[3].Key, Key(903)}
	col := e.get(c, keys)
	next := 0
	for i, k := range keys {
		if k.Hash >= 900 {
			if !errors.Is(col.Errs[i], transfer.ErrNotFound) {
				t.Errorf("missing block %d (%v): err = %v, want ErrNotFound", i, k, col.Errs[i])
			}
			if col.Buffered[i] {
				t.Errorf("missing block %d: Buffer was called", i)
			}
			continue
		}
		b := present[next]
		next++
		if col.Errs[i] != nil || string(col.Data[i]) != string(b.Data) || col.Headers[i] != b.Header {
			t.Errorf("present block %d (%v): err %v, header %+v; want its bytes and header",
				i, k, col.Errs[i], col.Headers[i])
		}
	}
}

func testSequential(t *testing.T, f Factory) {
	e := start(t, f, nil)
	c := e.dial()
	for round := range 150 {
		blocks := makeBlocks(index.Hash(1+round*4), 4, func(i int) int { return 1 + (round*31+i*977)%(32<<10) })
		e.put(c, blocks)
		wantBlocks(t, e.get(c, keysOf(blocks)), blocks)
		if t.Failed() {
			t.Fatalf("round %d failed", round)
		}
	}
	if e.mem.Len() != 600 {
		t.Errorf("stored %d blocks, want 600", e.mem.Len())
	}
}

func testConcurrent(t *testing.T, f Factory) {
	e := start(t, f, nil)
	shared := makeBlocks(1, 16, func(i int) int { return 16<<10 + i })
	e.seed(shared...)
	const conns, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for w := range conns {
		c := e.dial()
		wg.Go(func() {
			errs <- worker(e, c, w, rounds, shared)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// worker puts blocks of its own and reads them back with the shared ones,
// rounds times, over one Conn.
func worker(e *env, c transfer.Conn, w, rounds int, shared []transfer.Block) error {
	for r := range rounds {
		first := index.Hash(10_000 + (w*rounds+r)*8)
		own := makeBlocks(first, 8, func(i int) int { return 1 + (w*4099+r*17+i*1013)%(64<<10) })
		perr, err := c.Put(e.ctx(), own)
		if err != nil {
			return fmt.Errorf("conn %d round %d: Put: %w", w, r, err)
		}
		for i, err := range perr {
			if err != nil {
				return fmt.Errorf("conn %d round %d: Put block %d: %w", w, r, i, err)
			}
		}
		want := append(own, shared[r%len(shared)], shared[(r+w)%len(shared)])
		col := NewCollector(len(want))
		if err := c.Get(e.ctx(), keysOf(want), col); err != nil {
			return fmt.Errorf("conn %d round %d: Get: %w", w, r, err)
		}
		if len(col.Problems) > 0 || col.Reported() != len(want) {
			return fmt.Errorf("conn %d round %d: Receiver contract: %v, %d of %d reported",
				w, r, col.Problems, col.Reported(), len(want))
		}
		for i, b := range want {
			if col.Errs[i] != nil || string(col.Data[i]) != string(b.Data) {
				return fmt.Errorf("conn %d round %d: block %d (%v): err %v or bytes differ", w, r, i, b.Key, col.Errs[i])
			}
		}
	}
	return nil
}

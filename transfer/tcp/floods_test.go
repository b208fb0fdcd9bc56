package tcp

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// stallPuts opens n connections that each announce a put of one block of
// size bytes, send sent bytes of it, and stall.
func stallPuts(t *testing.T, addr string, n, size, sent int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for i := range n {
		c := rawDial(t, addr)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		b := transfertest.MakeBlock(index.Hash(1000+i), size)
		send(t, c, putFrames(b), b.Data[:sent])
		conns = append(conns, c)
	}
	return conns
}

// wellBehavedPut puts a block over a fresh connection and gets it back,
// all before its 5 s deadline.
func wellBehavedPut(t *testing.T, addr string, h index.Hash, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := New(Options{}).Dial(ctx, addr)
	if err != nil {
		t.Fatalf("a well-behaved client could not connect before its 5 s deadline: %v", err)
	}
	defer c.Close()
	b := transfertest.MakeBlock(h, size)
	errs, err := c.Put(ctx, []transfer.Block{b})
	if err != nil || errs[0] != nil {
		t.Fatalf("a well-behaved put was not stored before its 5 s deadline: %v, %v", err, errs)
	}
	col := transfertest.NewCollector(1)
	if err := c.Get(ctx, []index.Key{b.Key}, col); err != nil || col.Errs[0] != nil {
		t.Fatalf("a well-behaved get: %v, %v", err, col.Errs)
	}
}

// Peers that announce 4 MiB blocks, send a byte and stall reserve nothing,
// and are cut once their requests miss RequestTimeout plus MinRate's
// allowance, though each keeps sending a byte now and then.
func TestStalledPutsReserveNothingAndAreCut(t *testing.T) {
	mem := transfertest.NewMemory()
	addr := serve(t, Options{RequestTimeout: 500 * time.Millisecond, MinRate: 1000}, mem)
	stalled := stallPuts(t, addr, 8, 4<<20, 1)
	wellBehavedPut(t, addr, 1, 1<<20)
	if r := mem.Reserved(); r != 0 {
		t.Errorf("stalled puts hold %d reservations", r)
	}
	cut := make(chan error, len(stalled))
	for _, c := range stalled {
		go func() {
			var b [1]byte
			for { // a byte every 100 ms: no gap long, the rate far too low
				if _, err := c.Write(b[:]); err != nil {
					cut <- err
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	for range stalled {
		select {
		case <-cut:
		case <-time.After(10 * time.Second):
			t.Fatal("a put trickling in at 10 bytes/s is still being read after 10 s")
		}
	}
}

// Peers that send enough of their blocks to be given room and then stall
// hold at most MaxPendingBytes between them, and a put that needs room
// cuts the slowest of them.
func TestSlowPutsAreCutToMakeRoom(t *testing.T) {
	mem := transfertest.NewMemory()
	const block = 4 << 20
	addr := serve(t, Options{MaxPendingBytes: 2 * block}, mem)
	stalled := stallPuts(t, addr, 4, block, 64<<10+1)
	deadline := time.Now().Add(5 * time.Second)
	for mem.Reserved() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if r := mem.Reserved(); r != 2 {
		t.Fatalf("stalled puts hold %d blocks reserved, want the 2 MaxPendingBytes allows", r)
	}
	wellBehavedPut(t, addr, 1, block)
	wellBehavedPut(t, addr, 2, block)
	if r := mem.Reserved(); r > 2 {
		t.Errorf("%d blocks reserved, over MaxPendingBytes", r)
	}
	var closed int
	for _, c := range stalled {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			closed++
		}
	}
	if closed == 0 {
		t.Error("no stalled put was cut to make room")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

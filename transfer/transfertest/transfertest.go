// Package transfertest is the conformance suite every transfer.Transport
// backend passes: call Run from the backend's tests with a Factory that
// makes it. The suite serves a Memory handler (in this package), whose hooks
// inject the faults: corrupt bytes, a full store, a stalled or dying server.
//
// Subtests run in parallel, each on its own listener; a backend must allow
// several listeners in one process.
package transfertest

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Limits are the request limits the suite asks a backend for.
type Limits struct {
	MaxBlockSize int // bytes per block
	MaxBlocks    int // blocks per request
	MaxConns     int // connections one listener serves at once
}

// SuiteLimits are the limits the suite runs under: the production defaults,
// so that the suite moves blocks of the largest size engines use.
var SuiteLimits = Limits{MaxBlockSize: 4 << 20, MaxBlocks: 1024, MaxConns: 1024}

// Factory makes the backend under test.
type Factory struct {
	// New returns a transport whose servers enforce lim: a request over
	// either request limit is refused as a whole, a connection over
	// MaxConns with a reason.
	New func(t *testing.T, lim Limits) transfer.Transport
	// Addr is the address the suite listens on; the default is
	// "127.0.0.1:0" (any free port).
	Addr string
}

// opTimeout bounds every request the suite expects to succeed: a hang fails
// the test instead of stalling it.
const opTimeout = 20 * time.Second

// Run runs the suite.
func Run(t *testing.T, f Factory) {
	cases := []struct {
		name string
		run  func(t *testing.T, f Factory)
	}{
		{"PutThenGetRoundTripsBytesAndHeaders", testRoundTrip},
		{"ZeroLengthBlock", testZeroLength},
		{"ManyBlocksInOneRequest", testManyBlocks},
		{"LargestBlocks", testLargestBlocks},
		{"EmptyRequests", testEmptyRequests},
		{"MissingKeysAmongPresentOnes", testMissingKeys},
		{"ConnCarriesManySequentialRequests", testSequential},
		{"ConcurrentRequestsOverSeveralConns", testConcurrent},
		{"CorruptBytesFromServerAreReportedNotDelivered", testCorruptFromServer},
		{"CorruptPutIsRejectedPerBlock", testCorruptPut},
		{"HandlerErrorsComeBackPerBlock", testHandlerErrors},
		{"PutOverBlockSizeIsRefusedAsAWhole", testPutOverSize},
		{"PutOverBlockCountIsRefusedAsAWhole", testPutOverCount},
		{"GetOverBlockCountIsRefused", testGetOverCount},
		{"StalledServerHonoursDeadline", testStalledDeadline},
		{"StalledServerHonoursCancel", testStalledCancel},
		{"ServerClosedBetweenBlocks", testClosedBetweenBlocks},
		{"ServerClosedMidPayload", testClosedMidPayload},
		{"RedialAfterListenerRestart", testReconnect},
		{"ClosedConnAndListener", testClosed},
		{"ConnectionsOverTheLimitAreRefusedWithAReason", testConnectionLimit},
		{"DrainFinishesRequestsInFlight", testDrainFinishesRequestsInFlight},
		{"DrainGivesUpAtTheDeadline", testDrainGivesUpAtTheDeadline},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, f)
		})
	}
}

// env is one listener serving a Memory, for one subtest.
type env struct {
	t   *testing.T
	tr  transfer.Transport
	mem *Memory
	ln  transfer.Listener
}

// start serves a fresh Memory, with hooks set by setup before it serves.
// At cleanup it closes the listener and checks that the transport released
// every block it opened and committed every buffer it reserved.
func start(t *testing.T, f Factory, setup func(m *Memory)) *env {
	t.Helper()
	e := &env{t: t, tr: f.New(t, SuiteLimits), mem: NewMemory()}
	if setup != nil {
		setup(e.mem)
	}
	addr := f.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	e.listen(addr)
	t.Cleanup(func() {
		if err := e.ln.Close(); err != nil {
			t.Errorf("closing the listener: %v", err)
		}
		if n := e.mem.Pinned(); n != 0 {
			t.Errorf("%d opened blocks were never released", n)
		}
		if n := e.mem.Reserved(); n != 0 {
			t.Errorf("%d reserved buffers were never committed", n)
		}
		if n := e.mem.Misuse(); n != 0 {
			t.Errorf("release or commit called twice, %d times", n)
		}
	})
	return e
}

func (e *env) listen(addr string) {
	e.t.Helper()
	ln, err := e.tr.Listen(addr, e.mem)
	if err != nil {
		e.t.Fatalf("Listen(%s): %v", addr, err)
	}
	e.ln = ln
}

// dial opens a Conn to the listener, closed at cleanup.
func (e *env) dial() transfer.Conn {
	e.t.Helper()
	c, err := e.tr.Dial(e.ctx(), e.ln.Addr())
	if err != nil {
		e.t.Fatalf("Dial(%s): %v", e.ln.Addr(), err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

// ctx returns a context that bounds one request the test expects to work.
func (e *env) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	e.t.Cleanup(cancel)
	return ctx
}

// seed stores blocks straight into the Memory.
func (e *env) seed(blocks ...transfer.Block) {
	for _, b := range blocks {
		e.mem.Store(b)
	}
}

// put puts blocks and fails the test unless every one was stored.
func (e *env) put(c transfer.Conn, blocks []transfer.Block) {
	e.t.Helper()
	errs, err := c.Put(e.ctx(), blocks)
	if err != nil {
		e.t.Fatalf("Put of %d blocks: %v", len(blocks), err)
	}
	if len(errs) != len(blocks) {
		e.t.Fatalf("Put of %d blocks returned %d errors", len(blocks), len(errs))
	}
	for i, err := range errs {
		if err != nil {
			e.t.Fatalf("Put: block %d: %v", i, err)
		}
	}
}

// get gets keys and fails the test if the Get failed as a whole or broke
// the Receiver contract.
func (e *env) get(c transfer.Conn, keys []index.Key) *Collector {
	e.t.Helper()
	col := NewCollector(len(keys))
	if err := c.Get(e.ctx(), keys, col); err != nil {
		e.t.Fatalf("Get of %d keys: %v", len(keys), err)
	}
	checkContract(e.t, col, len(keys))
	return col
}

func checkContract(t *testing.T, col *Collector, n int) {
	t.Helper()
	for _, p := range col.Problems {
		t.Errorf("Receiver contract: %s", p)
	}
	if col.Reported() != n {
		t.Fatalf("Done was called for %d of %d blocks", col.Reported(), n)
	}
}

// wantBlocks checks that a Get delivered blocks intact.
func wantBlocks(t *testing.T, col *Collector, blocks []transfer.Block) {
	t.Helper()
	for i, b := range blocks {
		switch {
		case col.Errs[i] != nil:
			t.Errorf("block %d (%v, %d bytes): %v", i, b.Key, b.Size, col.Errs[i])
		case col.Headers[i] != b.Header:
			t.Errorf("block %d: header %+v, want %+v", i, col.Headers[i], b.Header)
		case !bytes.Equal(col.Data[i], b.Data):
			t.Errorf("block %d (%v, %d bytes): bytes differ", i, b.Key, b.Size)
		}
	}
}

// wantStored checks that the Memory holds blocks, bytes and headers.
func wantStored(t *testing.T, m *Memory, blocks []transfer.Block) {
	t.Helper()
	for i, b := range blocks {
		got, ok := m.Block(b.Key)
		switch {
		case !ok:
			t.Errorf("block %d (%v) was not stored", i, b.Key)
		case got.Header != b.Header:
			t.Errorf("block %d stored with header %+v, want %+v", i, got.Header, b.Header)
		case !bytes.Equal(got.Data, b.Data):
			t.Errorf("block %d (%v) stored with other bytes", i, b.Key)
		}
	}
}

// makeBlocks makes n blocks with hashes from first on, sized by size(i).
func makeBlocks(first index.Hash, n int, size func(i int) int) []transfer.Block {
	blocks := make([]transfer.Block, n)
	for i := range blocks {
		blocks[i] = MakeBlock(first+index.Hash(i), size(i))
	}
	return blocks
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

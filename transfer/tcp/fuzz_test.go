package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// The fuzz targets feed bytes from a hostile network to everything that
// decodes them: the frame decoders, a server session, a client Conn. None
// may panic, and none may allocate more than its limits allow.

// fuzzLimits are small limits, so that a fuzzer reaches them.
var fuzzLimits = Options{MaxBlockSize: 64 << 10, MaxBlocks: 8}

// fuzzAllocBound is the most bytes one fuzzed stream may make either side
// allocate: MaxBlocks buffers of MaxBlockSize, the session's and the Conn's
// own buffers, and slack for the runtime.
const fuzzAllocBound = 8*64<<10 + 512<<10

// FuzzDecodeFrames checks that every decoder of this backend's own frames
// (hellos, requests, responses) takes any bytes, and that a frame it
// accepts encodes back to the same bytes: there is one encoding of each
// frame, so two peers cannot read one frame two ways. Package frame fuzzes
// the keys, block headers and results both backends share.
func FuzzDecodeFrames(f *testing.F) {
	f.Add(putFrames(transfertest.MakeBlock(2, 10)))
	f.Add(getFrame(transfertest.Key(1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		b := make([]byte, max(helloSize, requestSize, responseSize))
		copy(b, data)
		if ver, st, n, err := decodeHello(b); err == nil && ver == version {
			again := make([]byte, helloSize)
			putHello(again, st, n)
			canonical(t, "hello", b[:helloSize], again)
		}
		if o, count, err := decodeRequest(b); err == nil {
			again := make([]byte, requestSize)
			putRequest(again, o, int(count))
			canonical(t, "request", b[:requestSize], again)
		}
		if st, flags, n, count, err := decodeResponse(b); err == nil {
			again := make([]byte, responseSize)
			putResponse(again, st, flags, n, int(count))
			canonical(t, "response", b[:responseSize], again)
		}
	})
}

func canonical(t *testing.T, what string, got, again []byte) {
	t.Helper()
	if !bytes.Equal(got, again) {
		t.Fatalf("%s % x decodes and encodes back as % x", what, got, again)
	}
}

// FuzzDecodeRequests serves a stream of request bytes as a client could
// send them, after the hellos.
func FuzzDecodeRequests(f *testing.F) {
	b := transfertest.MakeBlock(2, 100)
	f.Add(bytes.Join([][]byte{putFrames(b), b.Data, getFrame(b.Key, transfertest.Key(9))}, nil))
	f.Add(putFrames(transfertest.MakeBlock(1, 70<<10)))
	f.Add(getFrame(make([]index.Key, 9)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := fuzzLimits
		opts.EnsureDefaults()
		mem := transfertest.NewMemory()
		mem.Store(transfertest.MakeBlock(1, 1000))
		allocated := allocs(func() {
			s := &session{c: &fakeConn{r: bytes.NewReader(data)}, h: mem, opts: &opts}
			s.run()
		})
		if allocated > fuzzAllocBound {
			t.Errorf("serving %d bytes allocated %d bytes", len(data), allocated)
		}
		if mem.Pinned() != 0 || mem.Reserved() != 0 {
			t.Errorf("%d blocks left pinned, %d reservations left open", mem.Pinned(), mem.Reserved())
		}
	})
}

// FuzzDecodeResponses runs a Get and a Put on a Conn whose server answers
// with the fuzzed bytes.
func FuzzDecodeResponses(f *testing.F) {
	blocks := []transfer.Block{transfertest.MakeBlock(1, 100), transfertest.MakeBlock(2, 0)}
	resp := make([]byte, responseSize+2*frame.HeaderSize)
	putResponse(resp, frame.StatusOK, 0, 0, 2)
	frame.PutHeader(resp[responseSize:], &blocks[0].Header, frame.StatusOK, 0)
	frame.PutHeader(resp[responseSize+frame.HeaderSize:], &blocks[1].Header, frame.StatusNotFound, 0)
	results := make([]byte, responseSize+2*frame.ResultSize)
	putResponse(results, frame.StatusOK, 0, 0, 2)
	frame.PutResult(results[responseSize+frame.ResultSize:], frame.StatusCorrupt, 0)
	f.Add(bytes.Join([][]byte{resp[:responseSize+frame.HeaderSize], blocks[0].Data, resp[responseSize+frame.HeaderSize:], results}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		opts := fuzzLimits
		opts.EnsureDefaults()
		allocated := allocs(func() {
			c := &conn{nc: &fakeConn{r: bytes.NewReader(data)}, addr: "fuzz", opts: &opts}
			col := transfertest.NewCollector(2)
			if err := c.Get(context.Background(), []index.Key{blocks[0].Key, blocks[1].Key}, col); err == nil {
				if col.Reported() != 2 || len(col.Problems) > 0 {
					t.Errorf("Get succeeded with %d of 2 blocks reported, %v", col.Reported(), col.Problems)
				}
				if col.Errs[0] == nil && !bytes.Equal(col.Data[0], blocks[0].Data) {
					t.Error("Get delivered bytes that do not match the checksum as good")
				}
			}
			_, _ = c.Put(context.Background(), blocks)
		})
		if allocated > fuzzAllocBound {
			t.Errorf("reading %d bytes of responses allocated %d bytes", len(data), allocated)
		}
	})
}

// allocs returns the bytes the process allocated while f ran.
func allocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// fakeConn is a connection whose peer sends r and takes anything.
type fakeConn struct{ r io.Reader }

func (c *fakeConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *fakeConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *fakeConn) Close() error                     { return nil }
func (c *fakeConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fakeConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

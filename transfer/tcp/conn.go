package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// aLongTimeAgo is a deadline in the past: setting it fails blocked I/O now.
var aLongTimeAgo = time.Unix(1, 0)

// conn is the client side of one connection.
type conn struct {
	nc   net.Conn
	addr string
	opts *Options

	closed atomic.Bool // Close was called

	mu        sync.Mutex // held for a whole request
	broken    error      // why the connection carries no more requests
	deadline  time.Time  // the deadline set on nc
	stop      func() bool
	cur       request       // the request in flight, for errors
	intr      chan struct{} // interrupt signals here once it set aLongTimeAgo
	interrupt func()

	small [frame.HeaderSize]byte
	msg   [frame.MaxMsg]byte
	// ahead holds frame bytes a read took in past the frame it was for
	// (see readFrame), a slice of aheadBuf; never payload bytes.
	ahead    []byte
	aheadBuf [aheadSize]byte
	out      []byte // a request's header and keys or block headers
	iov      net.Buffers
	nb       net.Buffers
	scratch  []byte
	digest   index.Digest
}

// Dial connects to a node's data plane at addr and exchanges hellos.
func (t *Transport) Dial(ctx context.Context, addr string) (transfer.Conn, error) {
	if t.err != nil {
		return nil, t.err
	}
	d := net.Dialer{KeepAlive: t.opts.KeepAlive}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tcp: dial %s: %w", addr, err)
		}
		return nil, fmt.Errorf("tcp: dial %s: %w (%w)", addr, err, transfer.ErrUnavailable)
	}
	tune(nc, &t.opts)
	if t.opts.ClientTLS != nil {
		hsCtx, cancel := context.WithTimeout(ctx, t.opts.HandshakeTimeout)
		tc := tls.Client(nc, t.opts.ClientTLS(addr))
		err := tc.HandshakeContext(hsCtx)
		cancel()
		if err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("tcp: TLS with %s: %w", addr, err)
		}
		nc = tc
	}
	c := &conn{nc: nc, addr: addr, opts: &t.opts, intr: make(chan struct{}, 1)}
	c.interrupt = func() {
		_ = c.nc.SetDeadline(aLongTimeAgo)
		c.intr <- struct{}{}
	}
	if err := c.handshake(ctx); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *conn) handshake(ctx context.Context) error {
	hsCtx, cancel := context.WithTimeout(ctx, c.opts.HandshakeTimeout)
	defer cancel()
	c.arm(hsCtx)
	defer c.disarm()
	b := make([]byte, helloSize+len(c.opts.Token))
	putHello(b, frame.StatusOK, len(c.opts.Token))
	copy(b[helloSize:], c.opts.Token)
	if _, err := c.nc.Write(b); err != nil {
		return c.ioError(hsCtx, "handshake with "+c.addr, err)
	}
	b = b[:helloSize]
	if _, err := io.ReadFull(c.nc, b); err != nil {
		return c.ioError(hsCtx, "handshake with "+c.addr, err)
	}
	ver, st, msgLen, err := decodeHello(b)
	if err != nil {
		return fmt.Errorf("tcp: handshake with %s: %w", c.addr, err)
	}
	msg := c.msg[:msgLen]
	if _, err := io.ReadFull(c.nc, msg); err != nil {
		return c.ioError(hsCtx, "handshake with "+c.addr, err)
	}
	if err := frame.HelloAnswer(st, ver, version, msg); err != nil {
		return fmt.Errorf("tcp: dial %s: %w", c.addr, err)
	}
	return nil
}

// Get fetches keys and hands each block to r, in order, as it arrives.
func (c *conn) Get(ctx context.Context, keys []index.Key, r transfer.Receiver) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = request{Op: opGet, N: len(keys)}
	if err := c.usable(ctx); err != nil || len(keys) == 0 {
		return err
	}
	if len(keys) > MaxBlocksLimit {
		return fmt.Errorf("tcp: %v: %w: over the protocol's %d-block limit",
			c.cur.At(c.addr), transfer.ErrRefused, MaxBlocksLimit)
	}
	r, end := transfer.Staged(r) // blocks wanted in device memory come through host memory
	defer end()
	c.arm(ctx)
	defer c.disarm()
	out := grow(&c.out, requestSize+len(keys)*frame.KeySize)
	putRequest(out, opGet, len(keys))
	for i, k := range keys {
		frame.PutKey(out[requestSize+i*frame.KeySize:], k)
	}
	if _, err := c.nc.Write(out); err != nil {
		return c.fail(ctx, err)
	}
	// The first block's header comes right after the response's: one
	// read takes in both.
	if err := c.response(ctx, len(keys), frame.HeaderSize); err != nil {
		return err
	}
	for i, k := range keys {
		if err := c.block(ctx, i, k, r); err != nil {
			return err
		}
	}
	return nil
}

// block reads block i of a Get and reports it to r.
func (c *conn) block(ctx context.Context, i int, k index.Key, r transfer.Receiver) error {
	if err := c.readFrame(c.small[:frame.HeaderSize], 0); err != nil {
		return c.fail(ctx, err)
	}
	h, st, msgLen, err := frame.DecodeHeader(c.small[:frame.HeaderSize])
	if err != nil {
		return c.fail(ctx, fmt.Errorf("block %d: %w", i, err))
	}
	if err := frame.CheckGetHeader(i, k, h, st, c.opts.MaxBlockSize); err != nil {
		return c.fail(ctx, err)
	}
	msg := c.msg[:msgLen]
	if err := c.readFrame(msg, 0); err != nil {
		return c.fail(ctx, err)
	}
	if st != frame.StatusOK {
		r.Done(i, h, frame.BlockError("tcp", c.addr, i, h.Key, st, msg))
		return nil
	}
	buf := r.Buffer(i, h)
	if len(buf) != int(h.Size) {
		if err := c.discard(int64(h.Size)); err != nil {
			return c.fail(ctx, err)
		}
		r.Done(i, h, fmt.Errorf("tcp: block %d (%v): the receiver gave a %d-byte buffer for %d bytes",
			i, h.Key, len(buf), h.Size))
		return nil
	}
	sum, err := c.readSummed(buf)
	if err != nil {
		return c.fail(ctx, err)
	}
	if sum != h.Sum {
		r.Done(i, h, fmt.Errorf("tcp: block %d (%v) from %s: %w", i, h.Key, c.addr, transfer.ErrCorrupt))
		return nil
	}
	r.Done(i, h, nil)
	return nil
}

// Put sends blocks, headers first and then the bytes straight from each
// block's Data, and returns the server's outcome per block.
func (c *conn) Put(ctx context.Context, blocks []transfer.Block) ([]error, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = request{Op: opPut, N: len(blocks)}
	if err := c.usable(ctx); err != nil || len(blocks) == 0 {
		return nil, err
	}
	if err := frame.CheckPut(blocks, MaxBlocksLimit); err != nil {
		return nil, fmt.Errorf("tcp: %v: %w: %w", c.cur.At(c.addr), transfer.ErrRefused, err)
	}
	c.arm(ctx)
	defer c.disarm()
	out := grow(&c.out, requestSize+len(blocks)*frame.HeaderSize)
	putRequest(out, opPut, len(blocks))
	iov := append(c.iov[:0], out)
	for i := range blocks {
		frame.PutHeader(out[requestSize+i*frame.HeaderSize:], &blocks[i].Header, frame.StatusOK, 0)
		if len(blocks[i].Data) > 0 {
			iov = append(iov, blocks[i].Data)
		}
	}
	c.iov, c.nb = iov, iov
	_, werr := c.nb.WriteTo(c.nc)
	clear(c.iov) // keep no reference to the caller's bytes
	if werr != nil {
		// A server that refused the request and then closed may have
		// answered before the write failed: prefer its reason.
		if err := c.response(ctx, len(blocks), 0); err != nil && errors.Is(err, transfer.ErrRefused) {
			c.markBroken(err)
			return nil, err
		}
		return nil, c.fail(ctx, werr)
	}
	// The results follow the response: a read takes in as many of them as
	// have come.
	if err := c.response(ctx, len(blocks), len(blocks)*frame.ResultSize); err != nil {
		return nil, err
	}
	errs := make([]error, len(blocks))
	for i := range blocks {
		if err := c.readFrame(c.small[:frame.ResultSize], (len(blocks)-i-1)*frame.ResultSize); err != nil {
			return nil, c.fail(ctx, err)
		}
		st, msgLen, err := frame.DecodeResult(c.small[:frame.ResultSize])
		if err != nil {
			return nil, c.fail(ctx, fmt.Errorf("block %d: %w", i, err))
		}
		msg := c.msg[:msgLen]
		if err := c.readFrame(msg, (len(blocks)-i-1)*frame.ResultSize); err != nil {
			return nil, c.fail(ctx, err)
		}
		if st != frame.StatusOK {
			errs[i] = frame.BlockError("tcp", c.addr, i, blocks[i].Key, st, msg)
		}
	}
	return errs, nil
}

// response reads a response header and its message. A refusal comes back
// as an error that wraps transfer.ErrRefused; the connection stays usable
// unless the server said it is closing it. next is how many bytes of
// frames follow an OK response for sure (see readFrame).
func (c *conn) response(ctx context.Context, count, next int) error {
	if len(c.ahead) > 0 { // a response answers one request: nothing came before it
		return c.fail(ctx, fmt.Errorf("%w: %d bytes before the response", frame.ErrProtocol, len(c.ahead)))
	}
	if err := c.readFrame(c.small[:responseSize], next); err != nil {
		return c.fail(ctx, err)
	}
	st, flags, msgLen, n, err := decodeResponse(c.small[:responseSize])
	if err != nil {
		return c.fail(ctx, err)
	}
	msg := c.msg[:msgLen]
	if err := c.readFrame(msg, 0); err != nil {
		return c.fail(ctx, err)
	}
	switch {
	case st == frame.StatusRefused:
		err := fmt.Errorf("tcp: %v: %w: %s", c.cur.At(c.addr), transfer.ErrRefused, msg)
		if flags&flagClosing != 0 {
			c.markBroken(err)
		}
		return err
	case st != frame.StatusOK:
		return c.fail(ctx, fmt.Errorf("the node answered: %s", msg))
	case int(n) != count:
		return c.fail(ctx, fmt.Errorf("%w: response for %d blocks, want %d", frame.ErrProtocol, n, count))
	}
	return nil
}

// Close closes the connection; a request in flight fails with ErrClosed.
func (c *conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if err := c.nc.Close(); err != nil {
		return fmt.Errorf("tcp: close connection to %s: %w", c.addr, err)
	}
	return nil
}

// usable says why the connection cannot carry a request now, if it cannot.
func (c *conn) usable(ctx context.Context) error {
	switch {
	case c.closed.Load():
		return fmt.Errorf("tcp: %v: the connection is closed: %w", c.cur.At(c.addr), transfer.ErrClosed)
	case c.broken != nil:
		return fmt.Errorf("tcp: %v: the connection failed earlier (%v): %w",
			c.cur.At(c.addr), c.broken, transfer.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp: %v: %w", c.cur.At(c.addr), err)
	}
	return nil
}

// arm makes blocking I/O on the connection honour ctx: it sets ctx's
// deadline, and when ctx is cancelled a deadline in the past. disarm ends
// it; only then may the next request arm.
func (c *conn) arm(ctx context.Context) {
	d, _ := ctx.Deadline()
	if !d.Equal(c.deadline) {
		_ = c.nc.SetDeadline(d)
		c.deadline = d
	}
	if ctx.Done() != nil {
		c.stop = context.AfterFunc(ctx, c.interrupt)
	}
}

func (c *conn) disarm() {
	if c.stop != nil && !c.stop() {
		<-c.intr // interrupt ran or is running: wait until it set its deadline
		c.deadline = aLongTimeAgo
	}
	c.stop = nil
}

// fail marks the connection broken after an I/O or protocol error in the
// middle of a request, closes it, and returns the request's error.
func (c *conn) fail(ctx context.Context, err error) error {
	err = c.ioError(ctx, c.cur.At(c.addr).String(), err)
	c.markBroken(err)
	return err
}

func (c *conn) markBroken(err error) {
	c.broken = err
	_ = c.nc.Close()
}

// ioError says what made a request fail: the caller's ctx, a Close, the
// peer going away, or the error itself. It wraps transfer.ErrClosed, for the
// connection is of no more use.
func (c *conn) ioError(ctx context.Context, what string, err error) error {
	switch {
	case c.closed.Load():
		return fmt.Errorf("tcp: %s: the connection was closed: %w", what, transfer.ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("tcp: %s: %w (%w)", what, ctx.Err(), transfer.ErrClosed)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The connection's only deadline is ctx's, whose own timer may
		// not have fired yet.
		return fmt.Errorf("tcp: %s: %w (%w)", what, context.DeadlineExceeded, transfer.ErrClosed)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return fmt.Errorf("tcp: %s: the node closed the connection (%v): %w", what, err, transfer.ErrClosed)
	}
	return fmt.Errorf("tcp: %s: %w (%w)", what, err, transfer.ErrClosed)
}

// aheadSize bounds a read of frames, and holds the longest (a msg): a
// response's header and the first block header of a Get, or the results
// of a put of up to a hundred or so blocks, come in with one read.
const aheadSize = frame.MaxMsg

// readFrame fills p, a frame or part of one, from the bytes a read took in
// ahead and then from the connection. A read there asks for up to more
// bytes past p, which the caller knows are frames that follow p at once
// (0 when it does not know), and keeps them for the next readFrame: so
// the frames that arrive together are taken in with one read, and no read
// ever takes in payload bytes, which go straight to their buffer.
func (c *conn) readFrame(p []byte, more int) error {
	n := copy(p, c.ahead)
	c.ahead = c.ahead[n:]
	if n == len(p) {
		return nil
	}
	need := len(p) - n // at most frame.MaxMsg: no frame is longer
	buf := c.aheadBuf[:max(need, min(need+more, aheadSize))]
	m, err := io.ReadAtLeast(c.nc, buf, need)
	if err != nil {
		return err
	}
	copy(p[n:], buf[:need])
	c.ahead = buf[need:m]
	return nil
}

// readSummed fills buf from the connection and returns its xxhash64. It
// hashes each read's bytes as soon as they arrive, while they are still in
// the CPU's cache: a second pass over a 4 MiB block would read it back from
// memory.
func (c *conn) readSummed(buf []byte) (uint64, error) {
	c.digest.Reset()
	for n := 0; n < len(buf); {
		m, err := c.nc.Read(buf[n:])
		_, _ = c.digest.Write(buf[n : n+m])
		n += m
		if err != nil && n < len(buf) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return c.digest.Sum64(), nil
}

func (c *conn) discard(n int64) error {
	if c.scratch == nil {
		c.scratch = make([]byte, 64<<10)
	}
	for n > 0 {
		m := int(min(n, int64(len(c.scratch))))
		if _, err := io.ReadFull(c.nc, c.scratch[:m]); err != nil {
			return err
		}
		n -= int64(m)
	}
	return nil
}

// request names the request in flight, for errors.
type request = frame.Request

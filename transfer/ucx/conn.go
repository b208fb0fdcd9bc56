//go:build ucx

package ucx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// chunksInFlight is how many chunks of a block a client receives at once.
// One is as fast as more on shared memory and over loopback, and it keeps
// clear of a UCX 1.13 flaw: a sender's rendezvous sends on a shared-memory
// endpoint cannot all be cancelled once two of them were cut short by the
// receiver going away (see abortTimeout).
const chunksInFlight = 1

// aLongTimeAgo is a deadline in the past: setting it fails blocked I/O now.
var aLongTimeAgo = time.Unix(1, 0)

// conn is the client side of one connection: its own UCP context and
// worker, one endpoint to the node's worker, and the handshake socket,
// kept open as the connection's liveness signal.
type conn struct {
	opts  *Options
	addr  string
	nc    net.Conn
	w     *worker
	ep    epHandle
	id    uint32 // the node's id for the connection, in every tag
	chunk int    // the node's chunk size

	closed atomic.Bool  // Close was called
	gone   atomic.Bool  // UCX failed the endpoint
	hungUp atomic.Int64 // when the node closed the socket (Unix ns), 0 before

	mu     sync.Mutex // held for a whole request
	broken error      // why the connection carries no more requests
	torn   bool       // the UCX side is gone
	seq    uint8
	cur    request
	ops    []*op // posted during the request in flight
	free   []*op
	depth  int    // chunks of a block in flight at once
	ring   []*op  // their receives
	out    []byte // a request's frame
	resp   []byte
	hdr    [2][]byte
	res    []byte
	digest index.Digest
}

// Dial connects to a node's data plane at addr: it makes this connection's
// UCP worker, exchanges hellos and worker addresses over a TCP connection
// to addr, and connects a UCX endpoint to the node's worker.
func (t *Transport) Dial(ctx context.Context, addr string) (transfer.Conn, error) {
	if t.err != nil {
		return nil, t.err
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.HandshakeTimeout)
	defer cancel()
	w, err := startInline("connection to "+addr, t.settings, t.opts.BusyPoll)
	if err != nil {
		return nil, fmt.Errorf("ucx: dial %s: %w", addr, err)
	}
	d := net.Dialer{KeepAlive: t.opts.KeepAlive}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil && ctx.Err() == nil {
		err = fmt.Errorf("%w (%w)", err, transfer.ErrUnavailable)
	}
	if err != nil {
		w.destroy()
		return nil, fmt.Errorf("ucx: dial %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := &conn{opts: &t.opts, addr: addr, nc: nc, w: w, depth: chunksInFlight}
	c.ring = make([]*op, 0, c.depth+1)
	for i := range c.hdr {
		c.hdr[i] = make([]byte, frame.HeaderSize+frame.MaxMsg)
	}
	if err := c.handshake(ctx); err != nil {
		_ = nc.Close()
		w.destroy()
		return nil, err
	}
	go c.watch()
	return c, nil
}

func (c *conn) handshake(ctx context.Context) error {
	if d, ok := ctx.Deadline(); ok {
		_ = c.nc.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	defer stop()
	fail := func(err error) error {
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case !errors.Is(err, frame.ErrProtocol): // the node went away
			err = fmt.Errorf("%w (%w)", err, transfer.ErrUnavailable)
		}
		return fmt.Errorf("ucx: handshake with %s: %w", c.addr, err)
	}
	hello := make([]byte, clientHelloSize+len(c.w.addr))
	putClientHello(hello, len(c.w.addr))
	copy(hello[clientHelloSize:], c.w.addr)
	if _, err := c.nc.Write(hello); err != nil {
		return fail(err)
	}
	var b [serverHelloSize]byte
	if _, err := io.ReadFull(c.nc, b[:]); err != nil {
		return fail(err)
	}
	ver, st, msgLen, id, chunk, addrLen, err := decodeServerHello(b[:])
	if err != nil {
		return fail(err)
	}
	rest := make([]byte, msgLen+addrLen)
	if _, err := io.ReadFull(c.nc, rest); err != nil {
		return fail(err)
	}
	msg, peer := rest[:msgLen], rest[msgLen:]
	if err := frame.HelloAnswer(st, ver, version, msg); err != nil {
		return fmt.Errorf("ucx: dial %s: %w", c.addr, err)
	}
	c.id, c.chunk = id, chunk
	c.w.mu.Lock()
	c.ep, err = c.w.openEPLocked(peer, func(ucsStatus) { c.gone.Store(true) })
	c.w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("ucx: dial %s: %w", c.addr, err)
	}
	_ = c.nc.SetDeadline(time.Time{})
	return nil
}

// hangUpGrace is how long a request in flight may still complete after the
// node closed the socket. A draining node answers the request it serves
// and then closes the socket; the answer travels on UCX's own connections
// and may be received after the socket's end is seen.
const hangUpGrace = 250 * time.Millisecond

// watch waits for the node to close the handshake socket: it sends nothing
// after its hello, so any return of Read means the connection is over.
func (c *conn) watch() {
	var b [1]byte
	_, _ = c.nc.Read(b[:])
	c.hungUp.Store(time.Now().UnixNano())
	c.w.signal()
}

// over says whether the node is gone: UCX failed the endpoint or the node
// closed the socket.
func (c *conn) over() bool { return c.gone.Load() || c.hungUp.Load() != 0 }

// overLongAgo says whether a request in flight must stop waiting for the
// node: UCX failed the endpoint, or the node closed the socket more than
// hangUpGrace ago.
func (c *conn) overLongAgo() bool {
	at := c.hungUp.Load()
	return c.gone.Load() || at != 0 && time.Since(time.Unix(0, at)) > hangUpGrace
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
		return fmt.Errorf("ucx: %v: %w: over the protocol's %d-block limit", c.cur.At(c.addr), transfer.ErrRefused, MaxBlocksLimit)
	}
	if !c.w.cuda { // blocks wanted in device memory come through host memory
		var end func()
		r, end = transfer.Staged(r)
		defer end()
	}
	defer context.AfterFunc(ctx, c.w.signal)()
	seq := c.nextSeq()
	out := grow(&c.out, requestSize+len(keys)*frame.KeySize)
	putRequest(out, opGet, len(keys))
	for i, k := range keys {
		frame.PutKey(out[requestSize+i*frame.KeySize:], k)
	}
	resp := c.recv(grow(&c.resp, responseSize+frame.MaxMsg), tagOf(c.id, kindResponse, seq, 0, 0))
	req := c.send(out, tagOf(c.id, kindGet, seq, len(keys)-1, 0))
	hdr := c.recv(c.hdr[0], tagOf(c.id, kindHeader, seq, 0, 0))
	if err := c.post(ctx, resp, req, hdr); err != nil {
		return err
	}
	if err := c.response(ctx, resp, len(keys)); err != nil {
		return err
	}
	for i, k := range keys {
		var next *op
		if i+1 < len(keys) {
			next = c.recv(c.hdr[(i+1)%2], tagOf(c.id, kindHeader, seq, i+1, 0))
		}
		if err := c.block(ctx, seq, i, k, hdr, next, r); err != nil {
			return err
		}
		hdr = next
	}
	return c.settle(ctx)
}

// block receives block i of a Get, whose header comes in hdr, and reports
// it to r; next, posted along with the block's bytes, receives the next
// header.
func (c *conn) block(ctx context.Context, seq uint8, i int, k index.Key, hdr, next *op, r transfer.Receiver) error {
	if err := c.wait(ctx, hdr); err != nil {
		return err
	}
	if hdr.n < frame.HeaderSize {
		return c.fail(ctx, fmt.Errorf("%w: block %d: a %d-byte header", frame.ErrProtocol, i, hdr.n))
	}
	h, st, msgLen, err := frame.DecodeHeader(hdr.buf)
	switch {
	case err != nil:
		return c.fail(ctx, fmt.Errorf("block %d: %w", i, err))
	case frame.HeaderSize+msgLen != hdr.n:
		return c.fail(ctx, fmt.Errorf("%w: block %d: a %d-byte header with a %d-byte message", frame.ErrProtocol, i, hdr.n, msgLen))
	}
	if err := frame.CheckGetHeader(i, k, h, st, c.opts.MaxBlockSize); err != nil {
		return c.fail(ctx, err)
	}
	if st != frame.StatusOK {
		if next != nil {
			if err := c.post(ctx, next); err != nil {
				return err
			}
		}
		r.Done(i, h, frame.BlockError("ucx", c.addr, i, h.Key, st, hdr.buf[frame.HeaderSize:hdr.n]))
		return nil
	}
	if dr, ok := r.(transfer.DeviceReceiver); ok && c.w.cuda {
		if t, ok := dr.DeviceBuffer(i, h); ok {
			return c.deviceBlock(ctx, seq, i, h, t, next, r)
		}
	}
	buf := r.Buffer(i, h)
	fits := len(buf) == int(h.Size)
	n, each := chunking(int(h.Size), c.chunk)
	// c.depth chunks in flight: the next one's receive is posted as soon
	// as one is in, and that one is checksummed while the others move.
	ring := c.ring[:0]
	for j := range min(n, c.depth) {
		ring = append(ring, c.chunkRecv(buf, fits, each, seq, i, j))
	}
	first := ring
	if next != nil {
		// ring has room past its c.depth slots: next never meets a chunk.
		first = append(ring, next)
	}
	if err := c.post(ctx, first...); err != nil {
		return err
	}
	c.digest.Reset()
	for j := range n {
		o := ring[j%c.depth]
		if err := c.waitDone(ctx, o); err != nil {
			return err
		}
		if j+c.depth < n {
			ring[j%c.depth] = c.chunkRecv(buf, fits, each, seq, i, j+c.depth)
			if err := c.post(ctx, ring[j%c.depth]); err != nil {
				return err
			}
		}
		want := min(each, int(h.Size)-j*each)
		switch {
		case !fits && (o.st == ucsTruncated || o.st == ucsOK):
		case o.st != ucsOK:
			return c.fail(ctx, fmt.Errorf("block %d: %w", i, o.err()))
		case o.n != want:
			return c.fail(ctx, fmt.Errorf("%w: block %d: chunk %d of %d bytes, want %d", frame.ErrProtocol, i, j, o.n, want))
		default:
			_, _ = c.digest.Write(o.buf)
		}
	}
	switch {
	case !fits:
		r.Done(i, h, fmt.Errorf("ucx: block %d (%v): the receiver gave a %d-byte buffer for %d bytes", i, h.Key, len(buf), h.Size))
	case c.digest.Sum64() != h.Sum:
		r.Done(i, h, fmt.Errorf("ucx: block %d (%v) from %s: %w", i, h.Key, c.addr, transfer.ErrCorrupt))
	default:
		r.Done(i, h, nil)
	}
	return nil
}

// deviceBlock receives block i of a Get straight into the device memory t
// names (UCX built with CUDA), c.depth chunks in flight, and reports it to
// r; the transport cannot hash device memory, so t.Verify checks the
// bytes where the receiver gave one.
func (c *conn) deviceBlock(ctx context.Context, seq uint8, i int, h index.Header, t transfer.DeviceTarget, next *op, r transfer.Receiver) error {
	n, each := chunking(int(h.Size), c.chunk)
	recv := func(j int) *op {
		o := c.recv(nil, tagOf(c.id, kindBlock, seq, i, j))
		o.dev, o.devLen = t.Ptr+uint64(j*each), min(each, int(h.Size)-j*each)
		return o
	}
	ring := c.ring[:0]
	for j := range min(n, c.depth) {
		ring = append(ring, recv(j))
	}
	first := ring
	if next != nil {
		first = append(ring, next)
	}
	if err := c.post(ctx, first...); err != nil {
		return err
	}
	for j := range n {
		o := ring[j%c.depth]
		if err := c.waitDone(ctx, o); err != nil {
			return err
		}
		if j+c.depth < n {
			ring[j%c.depth] = recv(j + c.depth)
			if err := c.post(ctx, ring[j%c.depth]); err != nil {
				return err
			}
		}
		if want := min(each, int(h.Size)-j*each); o.st != ucsOK || o.n != want {
			if o.st != ucsOK {
				return c.fail(ctx, fmt.Errorf("block %d: %w", i, o.err()))
			}
			return c.fail(ctx, fmt.Errorf("%w: block %d: chunk %d of %d bytes, want %d", frame.ErrProtocol, i, j, o.n, want))
		}
	}
	var err error
	if t.Verify != nil {
		if verr := t.Verify(h); verr != nil {
			err = fmt.Errorf("ucx: block %d (%v) from %s, in device memory: %w", i, h.Key, c.addr, verr)
		}
	}
	r.Done(i, h, err)
	return nil
}

// chunkRecv returns the receive of chunk j of block i into buf; a block that
// does not fit its buffer is received into nothing: dropped.
func (c *conn) chunkRecv(buf []byte, fits bool, each int, seq uint8, i, j int) *op {
	var dst []byte
	if fits {
		dst = chunkOf(buf, j, each)
	}
	return c.recv(dst, tagOf(c.id, kindBlock, seq, i, j))
}

// Put sends blocks: their headers first; once the node has reserved room
// and said which blocks to send, their bytes, straight from each block's
// Data. It returns the node's outcome per block.
func (c *conn) Put(ctx context.Context, blocks []transfer.Block) ([]error, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = request{Op: opPut, N: len(blocks)}
	if err := c.usable(ctx); err != nil || len(blocks) == 0 {
		return nil, err
	}
	if err := frame.CheckPut(blocks, MaxBlocksLimit); err != nil {
		return nil, fmt.Errorf("ucx: %v: %w: %w", c.cur.At(c.addr), transfer.ErrRefused, err)
	}
	defer context.AfterFunc(ctx, c.w.signal)()
	seq := c.nextSeq()
	out := grow(&c.out, requestSize+len(blocks)*frame.HeaderSize)
	putRequest(out, opPut, len(blocks))
	for i := range blocks {
		frame.PutHeader(out[requestSize+i*frame.HeaderSize:], &blocks[i].Header, frame.StatusOK, 0)
	}
	resp := c.recv(grow(&c.resp, responseSize+frame.MaxMsg+len(blocks)), tagOf(c.id, kindResponse, seq, 0, 0))
	req := c.send(out, tagOf(c.id, kindPut, seq, len(blocks)-1, 0))
	if err := c.post(ctx, resp, req); err != nil {
		return nil, err
	}
	if err := c.response(ctx, resp, len(blocks)); err != nil {
		return nil, err
	}
	_, msg, _, _ := decodeResponse(resp.buf[:resp.n])
	accepted := resp.buf[responseSize+len(msg) : resp.n]
	if len(accepted) != len(blocks) {
		return nil, c.fail(ctx, fmt.Errorf("%w: a go-ahead for %d blocks, want %d", frame.ErrProtocol, len(accepted), len(blocks)))
	}
	results := c.recv(grow(&c.res, responseSize+len(blocks)*(frame.ResultSize+frame.MaxMsg)), tagOf(c.id, kindResults, seq, 0, 0))
	ops := []*op{results}
	for i, b := range blocks {
		if accepted[i] != 1 {
			continue
		}
		n, each := chunking(len(b.Data), c.chunk)
		for j := range n {
			ops = append(ops, c.send(chunkOf(b.Data, j, each), tagOf(c.id, kindPayload, seq, i, j)))
		}
	}
	if err := c.post(ctx, ops...); err != nil {
		return nil, err
	}
	if err := c.wait(ctx, results); err != nil {
		return nil, err
	}
	errs, err := c.results(results.buf[:results.n], blocks)
	if err != nil {
		return nil, c.fail(ctx, err)
	}
	if err := c.settle(ctx); err != nil {
		return nil, err
	}
	return errs, nil
}

func (c *conn) results(b []byte, blocks []transfer.Block) ([]error, error) {
	st, _, count, err := decodeResponse(b)
	switch {
	case err != nil:
		return nil, err
	case st != frame.StatusOK || count != len(blocks):
		return nil, fmt.Errorf("%w: results with status %d for %d blocks, want %d", frame.ErrProtocol, st, count, len(blocks))
	}
	errs := make([]error, len(blocks))
	rest := b[responseSize:]
	for i := range blocks {
		st, msg, r, err := decodeResult(rest)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		rest = r
		if st != frame.StatusOK {
			errs[i] = frame.BlockError("ucx", c.addr, i, blocks[i].Key, st, msg)
		}
	}
	return errs, nil
}

// response waits for a request's answer. A refusal comes back as an error
// that wraps transfer.ErrRefused, and the connection stays usable.
func (c *conn) response(ctx context.Context, resp *op, count int) error {
	if err := c.wait(ctx, resp); err != nil {
		return err
	}
	st, msg, n, err := decodeResponse(resp.buf[:resp.n])
	switch {
	case err != nil:
		return c.fail(ctx, err)
	case st == frame.StatusRefused:
		err := fmt.Errorf("ucx: %v: %w: %s", c.cur.At(c.addr), transfer.ErrRefused, msg)
		if serr := c.settle(ctx); serr != nil {
			return serr
		}
		return err
	case st != frame.StatusOK:
		return c.fail(ctx, fmt.Errorf("the node answered: %s", msg))
	case n != count:
		return c.fail(ctx, fmt.Errorf("%w: response for %d blocks, want %d", frame.ErrProtocol, n, count))
	}
	return nil
}

// Close closes the connection; a request in flight fails with ErrClosed.
// It returns once the connection's UCX worker is freed.
func (c *conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	_ = c.nc.Close()
	c.w.signal()
	c.mu.Lock() // the request in flight, if any, sees closed and fails
	defer c.mu.Unlock()
	c.teardown()
	return nil
}

func (c *conn) nextSeq() uint8 {
	c.seq++
	return c.seq
}

// usable says why the connection cannot carry a request now, if it cannot.
func (c *conn) usable(ctx context.Context) error {
	switch {
	case c.closed.Load():
		return fmt.Errorf("ucx: %v: the connection is closed: %w", c.cur.At(c.addr), transfer.ErrClosed)
	case c.broken != nil:
		return fmt.Errorf("ucx: %v: the connection failed earlier (%v): %w", c.cur.At(c.addr), c.broken, transfer.ErrClosed)
	case c.over():
		err := fmt.Errorf("ucx: %v: the node closed the connection: %w", c.cur.At(c.addr), transfer.ErrClosed)
		c.broken = err
		c.teardown()
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ucx: %v: %w", c.cur.At(c.addr), err)
	}
	return nil
}

// request names the request in flight, for errors.
type request = frame.Request

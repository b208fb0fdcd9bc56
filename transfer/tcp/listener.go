package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// maxRefusing is the most connections a listener refuses at once (reading
// their hello, writing one that says why); beyond it, connections over the
// limit are closed without a word.
const maxRefusing = 64

// listener serves a Handler on one TCP endpoint.
type listener struct {
	opts *Options
	h    transfer.Handler
	ln   net.Listener

	mu       sync.Mutex
	closed   bool
	draining bool                  // Shutdown: finish requests in flight, take no new ones
	pending  *pendingPuts          // room reserved for blocks still arriving
	conns    map[net.Conn]struct{} // served and being refused; Close closes them
	busy     map[net.Conn]bool     // served connections with a request in flight
	serving  int                   // connections served, at most opts.MaxConns
	refusing int                   // connections being refused
	wg       sync.WaitGroup        // the accept loop and every connection's goroutine
}

var _ transfer.Drainer = (*listener)(nil)

// Listen serves h on addr ("host:port"; port 0 picks a free one) until the
// Listener is closed.
func (t *Transport) Listen(addr string, h transfer.Handler) (transfer.Listener, error) {
	if t.err != nil {
		return nil, t.err
	}
	if h == nil {
		return nil, fmt.Errorf("tcp: listen on %s: nil Handler", addr)
	}
	lc := net.ListenConfig{KeepAlive: t.opts.KeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s: %w", addr, err)
	}
	l := &listener{opts: &t.opts, h: h, ln: ln, pending: newPendingPuts(&t.opts),
		conns: make(map[net.Conn]struct{}), busy: make(map[net.Conn]bool)}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr returns the address the listener is bound to, with the port it got.
func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every live connection and waits for their
// goroutines, and so for the Handler calls in flight, to return. Closing a
// closed listener waits the same way and returns nil.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.wg.Wait()
		return nil
	}
	l.closed = true
	err := l.ln.Close()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	if err != nil {
		return fmt.Errorf("tcp: close listener %s: %w", l.Addr(), err)
	}
	return nil
}

// Shutdown drains the listener: see transfer.Drainer.
func (l *listener) Shutdown(ctx context.Context) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.wg.Wait()
		return nil
	}
	l.draining = true
	_ = l.ln.Close()
	for c := range l.conns {
		if !l.busy[c] { // idle, or being refused: nothing to finish
			_ = c.Close()
		}
	}
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		return nil
	case <-ctx.Done():
		_ = l.Close()
		return fmt.Errorf("tcp: drain %s: %w", l.Addr(), ctx.Err())
	}
}

// begin marks c busy with a request; it reports false while draining.
func (l *listener) begin(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.draining || l.closed {
		return false
	}
	l.busy[c] = true
	return true
}

// end marks c's request done; it reports false when c should close now.
func (l *listener) end(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.busy, c)
	return !l.draining && !l.closed
}

func (l *listener) accept() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or a similar passing trouble: wait a
			// little, as net/http does, instead of spinning.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		tune(c, l.opts)
		l.admit(c)
	}
}

// admit starts serving c, or refusing it when the listener is at its limit.
func (l *listener) admit(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		_ = c.Close()
	case l.serving < l.opts.MaxConns:
		l.serving++
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		go l.serve(c)
	case l.refusing < maxRefusing:
		l.refusing++
		l.conns[c] = struct{}{}
		l.wg.Add(1)
		go l.refuse(c)
	default:
		_ = c.Close()
	}
}

func (l *listener) release(c net.Conn, served bool) {
	_ = c.Close()
	l.mu.Lock()
	delete(l.conns, c)
	delete(l.busy, c)
	if served {
		l.serving--
	} else {
		l.refusing--
	}
	l.mu.Unlock()
	l.wg.Done()
}

// refuse reads c's hello, so that closing does not reset the connection and
// lose the answer, and answers with a hello that says why c is refused.
func (l *listener) refuse(c net.Conn) {
	defer l.release(c, false)
	_ = c.SetDeadline(time.Now().Add(min(l.opts.HandshakeTimeout, time.Second)))
	var hello [helloSize]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return
	}
	writeHello(c, frame.StatusUnavailable, fmt.Sprintf(
		"node is serving its limit of %d data-plane connections; retry later, pool fewer connections per client, or raise MaxConns",
		l.opts.MaxConns))
}

// serve runs one connection: the hellos, then requests until the peer goes
// away, breaks the protocol, or the listener closes.
func (l *listener) serve(c net.Conn) {
	defer l.release(c, true)
	if !l.handshake(c) {
		return
	}
	s := &session{c: c, h: l.h, opts: l.opts, pending: l.pending,
		begin: func() bool { return l.begin(c) }, end: func() bool { return l.end(c) }}
	s.run()
}

func (l *listener) handshake(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(l.opts.HandshakeTimeout))
	var hello [helloSize]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return false
	}
	ver, _, _, err := decodeHello(hello[:])
	switch {
	case err != nil:
		writeHello(c, frame.StatusError, "not a kvstrata data-plane hello: "+err.Error())
		return false
	case ver != version:
		writeHello(c, frame.StatusRefused, fmt.Sprintf(
			"protocol version %d is not supported; this node speaks version %d", ver, version))
		return false
	}
	if err := writeHello(c, frame.StatusOK, ""); err != nil {
		return false
	}
	_ = c.SetDeadline(time.Time{})
	return true
}

// writeHello writes a server hello with msg (cut to frame.MaxMsg bytes).
func writeHello(c net.Conn, st frame.Status, msg string) error {
	msg = frame.Clip(msg)
	b := make([]byte, helloSize+len(msg))
	putHello(b, st, len(msg))
	copy(b[helloSize:], msg)
	_, err := c.Write(b)
	return err
}

// tune sets the socket options of a new connection.
func tune(c net.Conn, o *Options) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	// Every frame goes out in one write or writev; without Nagle a small
	// response is not held back waiting for an ACK.
	_ = tc.SetNoDelay(true)
	if o.ReadBufferSize > 0 {
		_ = tc.SetReadBuffer(o.ReadBufferSize)
	}
	if o.WriteBufferSize > 0 {
		_ = tc.SetWriteBuffer(o.WriteBufferSize)
	}
}

package tcp

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/internal/netserve"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// listener serves a Handler on one TCP endpoint; netserve admits, tracks
// and drains its connections.
type listener struct {
	opts    *Options
	h       transfer.Handler
	ln      net.Listener
	pending *pendingPuts // room reserved for blocks still arriving
	srv     *netserve.Server[*served]
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
	l := &listener{opts: &t.opts, h: h, ln: ln, pending: newPendingPuts(&t.opts)}
	l.srv = netserve.New(netserve.Config[*served]{
		MaxConns:    t.opts.MaxConns,
		MaxRefusing: frame.MaxRefusing,
		Accepted:    func(c net.Conn) { tune(c, l.opts) },
		Open:        func(c net.Conn) *served { return &served{l: l, c: l.secure(c)} },
		Refuse:      l.refuse,
	})
	l.srv.Start(ln)
	return l, nil
}

// Addr returns the address the listener is bound to, with the port it got.
func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every live connection and waits for their
// goroutines, and so for the Handler calls in flight, to return. Closing a
// closed listener waits the same way and returns nil.
func (l *listener) Close() error {
	if err := l.srv.Close(); err != nil {
		return fmt.Errorf("tcp: close listener %s: %w", l.Addr(), err)
	}
	return nil
}

// Shutdown drains the listener: see transfer.Drainer.
func (l *listener) Shutdown(ctx context.Context) error {
	if err := l.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("tcp: drain %s: %w", l.Addr(), err)
	}
	return nil
}

// refuse reads c's hello, so that closing does not reset the connection and
// lose the answer, and answers with a hello that says why c is refused.
func (l *listener) refuse(c net.Conn) {
	c = l.secure(c)
	_ = c.SetDeadline(time.Now().Add(min(l.opts.HandshakeTimeout, time.Second)))
	var hello [helloSize + frame.MaxMsg]byte
	if _, err := io.ReadFull(c, hello[:helloSize]); err != nil {
		return
	}
	if _, _, n, err := decodeHello(hello[:helloSize]); err == nil { // and its credential
		if _, err := io.ReadFull(c, hello[helloSize:helloSize+n]); err != nil {
			return
		}
	}
	writeHello(c, frame.StatusUnavailable, frame.ConnLimitMsg(l.opts.MaxConns))
}

// served is one connection the listener serves (a netserve.Conn): the
// hellos, then a session, bracketed request by request for the drain.
type served struct {
	l *listener
	c net.Conn

	mu   sync.Mutex
	busy bool // a request is in flight
	over bool // Drain or Cut: start no other request
}

// Serve runs the connection: the hellos, then requests until the peer
// goes away, breaks the protocol, or the listener closes.
func (x *served) Serve() {
	defer x.c.Close()
	h := x.l.handshake(x.c)
	if h == nil {
		return
	}
	s := &session{c: x.c, h: h, opts: x.l.opts, pending: x.l.pending,
		begin: x.begin, end: x.end}
	s.run()
}

// Drain closes the connection now if it is idle (or still in its
// handshake), else once its request is answered.
func (x *served) Drain() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.over = true
	if !x.busy {
		_ = x.c.Close()
	}
}

// Cut closes the connection now.
func (x *served) Cut() {
	x.mu.Lock()
	x.over = true
	x.mu.Unlock()
	_ = x.c.Close()
}

// begin marks a request in flight; it reports false once the connection
// drains.
func (x *served) begin() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.over {
		return false
	}
	x.busy = true
	return true
}

// end marks the request done; it reports false when the connection should
// close now.
func (x *served) end() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.busy = false
	return !x.over
}

// handshake exchanges the hellos and returns the Handler that serves the
// connection: the listener's, or the one its Authenticator gives for the
// credential the client's hello carried. It returns nil when the
// connection is not to be served.
func (l *listener) handshake(c net.Conn) transfer.Handler {
	_ = c.SetDeadline(time.Now().Add(l.opts.HandshakeTimeout))
	var hello [helloSize + frame.MaxMsg]byte
	if _, err := io.ReadFull(c, hello[:helloSize]); err != nil {
		return nil
	}
	ver, _, n, err := decodeHello(hello[:helloSize])
	switch {
	case err != nil:
		writeHello(c, frame.StatusError, "not a kvstrata data-plane hello: "+err.Error())
		return nil
	case ver != version:
		writeHello(c, frame.StatusRefused, fmt.Sprintf(
			"protocol version %d is not supported; this node speaks version %d", ver, version))
		return nil
	}
	token := hello[helloSize : helloSize+n]
	if _, err := io.ReadFull(c, token); err != nil {
		return nil
	}
	h := l.h
	if a, ok := h.(transfer.Authenticator); ok {
		creds := transfer.Credentials{Token: string(token)}
		if tc, ok := c.(interface{ ConnectionState() tls.ConnectionState }); ok {
			st := tc.ConnectionState()
			creds.TLS = &st
		}
		if h, err = a.Authenticate(creds); err != nil || h == nil {
			msg := "authenticate first"
			if err != nil {
				msg = err.Error()
			}
			writeHello(c, frame.StatusUnauthenticated, msg)
			return nil
		}
	}
	if err := writeHello(c, frame.StatusOK, ""); err != nil {
		return nil
	}
	_ = c.SetDeadline(time.Time{})
	return h
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

// secure wraps c in TLS when the listener speaks it; the handshake runs
// on the first read, under the hello's deadline.
func (l *listener) secure(c net.Conn) net.Conn {
	if l.opts.ServerTLS == nil {
		return c
	}
	return tls.Server(c, l.opts.ServerTLS)
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

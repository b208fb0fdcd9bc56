package zmtpguard

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4/transport"
)

// guarded is the zmq4 transport: tcp's, with each connection wrapped.
type guarded struct{ tcp transport.Transport }

var _ transport.Transport = guarded{}

func (g guarded) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return newConn(ctx, c, limitsOf(ctx), nil), nil
}

func (g guarded) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := g.tcp.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	lim := limitsOf(ctx)
	return &listener{Listener: l, ctx: ctx, lim: lim, slots: make(chan struct{}, lim.MaxConns)}, nil
}

func (g guarded) Addr(ep string) (string, error) { return g.tcp.Addr(ep) }

// listener closes, at accept, the connections over its limit.
type listener struct {
	net.Listener
	ctx   context.Context // the socket's
	lim   Limits
	slots chan struct{} // one token per open connection
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return newConn(l.ctx, c, l.lim, func() { <-l.slots }), nil
		default:
			reject(l.lim, fmt.Errorf("%w: %s: %d open", ErrTooManyConns, c.RemoteAddr(), l.lim.MaxConns))
			c.Close()
		}
	}
}

func reject(lim Limits, err error) {
	if lim.OnReject != nil {
		lim.OnReject(err)
	}
}

// conn passes what its peer sends through a Parser.
type conn struct {
	net.Conn
	lim      Limits
	release  func() // frees the listener's slot; nil for a dialed conn
	closing  sync.Once
	hsMu     sync.Mutex  // guards the two below
	deadline *time.Timer // closes the connection past the handshake timeout
	stop     func() bool // stops closing the connection when the socket's context ends
	done     atomic.Bool // the handshake finished
	closed   atomic.Bool
	rejected atomic.Bool // OnReject was told

	mu sync.Mutex // serializes Reads, which zmq4 makes from one goroutine at a time anyway
	p  *Parser
}

// newConn wraps c, a connection of the socket whose context is ctx.
func newConn(ctx context.Context, c net.Conn, lim Limits, release func()) *conn {
	g := &conn{Conn: c, lim: lim, release: release, p: NewParser(lim)}
	g.hsMu.Lock()
	defer g.hsMu.Unlock()
	// zmq4 reads the handshake without a deadline, in its accept loop for
	// a listener, and heeds neither the socket's context nor its Close:
	// close a connection whose handshake does not finish in time, or
	// before the socket closes.
	g.deadline = time.AfterFunc(lim.HandshakeTimeout, func() {
		if !g.done.Load() && !g.closed.Load() {
			g.fail(fmt.Errorf("%w: %s after %v", ErrHandshakeTimeout, c.RemoteAddr(), lim.HandshakeTimeout))
		}
	})
	g.stop = context.AfterFunc(ctx, func() {
		if !g.done.Load() {
			g.Close()
		}
	})
	return g
}

// Read reads from the peer and hands on the bytes only if they are
// well-formed and within limits; otherwise it closes the connection and
// returns an error that zmq4 takes for a lost connection (a net.Error
// that is no timeout), without any of the bytes of this read.
func (g *conn) Read(b []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.done.Load() && g.p.Handshaken() {
		// zmq4 reads past the peer's READY only once its handshake is done.
		g.done.Store(true)
		g.endHandshake()
	}
	n, err := g.Conn.Read(b)
	if perr := g.p.Feed(b[:n]); perr != nil {
		perr = fmt.Errorf("%w (from %s)", perr, g.RemoteAddr())
		g.fail(perr)
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: g.LocalAddr(), Addr: g.RemoteAddr(), Err: perr}
	}
	return n, err
}

// Write writes b within the write timeout; past it, it closes the
// connection and returns an error that zmq4 takes for a lost connection.
func (g *conn) Write(b []byte) (int, error) {
	if err := g.Conn.SetWriteDeadline(time.Now().Add(g.lim.WriteTimeout)); err != nil {
		return 0, err
	}
	n, err := g.Conn.Write(b)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		werr := fmt.Errorf("%w: %s took not %d bytes in %v", ErrWriteTimeout, g.RemoteAddr(), len(b), g.lim.WriteTimeout)
		g.fail(werr)
		return n, &net.OpError{Op: "write", Net: "tcp", Source: g.LocalAddr(), Addr: g.RemoteAddr(), Err: werr}
	}
	return n, err
}

// endHandshake stops watching the handshake.
func (g *conn) endHandshake() {
	g.hsMu.Lock()
	defer g.hsMu.Unlock()
	g.deadline.Stop()
	g.stop()
}

// fail reports err, once, and closes the connection (in that order, so
// that a peer that sees the close can see it counted).
func (g *conn) fail(err error) {
	if g.rejected.CompareAndSwap(false, true) {
		reject(g.lim, err)
	}
	g.Close()
}

func (g *conn) Close() error {
	err := net.ErrClosed
	g.closing.Do(func() {
		g.closed.Store(true)
		g.endHandshake()
		// Free the slot first: a reader of this connection may go on to
		// accept the next one as soon as it is closed.
		if g.release != nil {
			g.release()
		}
		err = g.Conn.Close()
		if g.lim.OnClose != nil {
			g.lim.OnClose()
		}
	})
	return err
}

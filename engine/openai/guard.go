package openai

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Limits.
const (
	// DefaultMaxConns bounds the connections a worker serves at once.
	DefaultMaxConns = 4096
	// DefaultHeaderTimeout bounds reading a request's headers.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout and DefaultMinBodyRate bound reading a request's
	// body: 10 s plus a second per 64 KiB received.
	DefaultBodyTimeout = 10 * time.Second
	DefaultMinBodyRate = 64 << 10
	// DefaultIdleTimeout closes a keep-alive connection idle this long.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultWriteStallTimeout cuts a client that takes no part of a
	// response for this long.
	DefaultWriteStallTimeout = 30 * time.Second
	// MaxHeaderBytes bounds a request's headers (net/http's default, made
	// explicit): larger ones are answered 431.
	MaxHeaderBytes = 1 << 20
)

// evictAfter is how long a connection must have waited for its request,
// at under MinBodyRate, before a new connection may displace it.
const evictAfter = time.Second

// maxRefusing bounds the connections being answered 503 at once; beyond
// it, a connection over MaxConns is closed without a word.
const maxRefusing = 256

// refuseTimeout bounds the whole of a refusal: writing the 503, and
// waiting for the client to close its side so it reads the answer.
const refuseTimeout = time.Second

// writeChunk is the most one write deadline covers: a response written in
// one call is written in pieces of this size, each within
// WriteStallTimeout, so a large answer to a slow reader is not cut.
const writeChunk = 64 << 10

// Limits bound what a client's connections may hold of a worker, as the
// cache node's RESP server bounds its clients. They apply to the
// connections of the listener HTTPServer returns; BodyTimeout and
// MinBodyRate apply to every request the Server handles.
type Limits struct {
	// MaxConns is the most connections served at once. A connection over
	// it displaces the connection that has waited longest for its request
	// or sent it slowest — idle between requests, or receiving headers or
	// a body at under MinBodyRate — if that one has for more than a
	// second: it is closed, told 503 if it was sending a body. With none
	// to displace, the new connection is answered 503 with Retry-After: 1
	// and closed; accepting never waits. The default is DefaultMaxConns.
	MaxConns int
	// HeaderTimeout bounds reading a request's headers (net/http's
	// ReadHeaderTimeout); a client that misses it is disconnected. The
	// default is DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// BodyTimeout and MinBodyRate bound reading a request's body:
	// BodyTimeout plus one second per MinBodyRate bytes received so far
	// (the RESP server's CommandTimeout and MinReadRate rule), however
	// often bytes trickle in. A body not received in time is answered 408
	// and its connection closed; the engine never sees the request. The
	// bound ends once the body is read: a response streams for as long as
	// it generates. The defaults are DefaultBodyTimeout and
	// DefaultMinBodyRate (bytes per second).
	BodyTimeout time.Duration
	MinBodyRate int64
	// IdleTimeout closes a keep-alive connection that starts no new
	// request for this long. The default is DefaultIdleTimeout.
	IdleTimeout time.Duration
	// WriteStallTimeout bounds each write of a response, in pieces of 64
	// KiB: a client that stops reading (a stream it no longer takes) is
	// cut once a write makes no progress for this long; its request's
	// context is cancelled and the engine frees the request's blocks. It
	// does not bound a whole response: a stream read at any pace lasts as
	// long as it generates. The default is DefaultWriteStallTimeout.
	WriteStallTimeout time.Duration
}

// EnsureDefaults replaces the zero value of every field with its default.
func (l *Limits) EnsureDefaults() {
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.HeaderTimeout == 0 {
		l.HeaderTimeout = DefaultHeaderTimeout
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	if l.MinBodyRate == 0 {
		l.MinBodyRate = DefaultMinBodyRate
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.WriteStallTimeout == 0 {
		l.WriteStallTimeout = DefaultWriteStallTimeout
	}
}

// Problems returns a line per invalid field, each naming it. Call it
// after EnsureDefaults.
func (l *Limits) Problems() []string {
	var probs []string
	if l.MaxConns <= 0 {
		probs = append(probs, fmt.Sprintf("MaxConns is %d, must be > 0", l.MaxConns))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HeaderTimeout", l.HeaderTimeout}, {"BodyTimeout", l.BodyTimeout}, {"IdleTimeout", l.IdleTimeout}, {"WriteStallTimeout", l.WriteStallTimeout}} {
		if d.v <= 0 {
			probs = append(probs, fmt.Sprintf("%s is %v, must be > 0", d.name, d.v))
		}
	}
	if l.MinBodyRate <= 0 {
		probs = append(probs, fmt.Sprintf("MinBodyRate is %d, must be > 0", l.MinBodyRate))
	}
	return probs
}

// HTTPServer returns an http.Server that serves s within its Limits, and
// ln wrapped to admit and track connections for it: serve with
// srv.Serve(guarded). The http.Server's timeouts are HeaderTimeout and
// IdleTimeout; it has no ReadTimeout or WriteTimeout, which would bound
// a whole stream (and a read deadline expiring in the background cancels
// the request). Call it once per Server.
func (s *Server) HTTPServer(ln net.Listener) (srv *http.Server, guarded net.Listener) {
	g := s.guard
	srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.cfg.Limits.HeaderTimeout,
		IdleTimeout:       s.cfg.Limits.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ConnState:         g.connState,
		ConnContext: func(ctx context.Context, nc net.Conn) context.Context {
			if gc, ok := nc.(*guardConn); ok {
				return context.WithValue(ctx, connKey{}, gc)
			}
			return ctx
		},
	}
	return srv, &guardListener{Listener: ln, g: g}
}

// ConnStats counts a Server's connections.
type ConnStats struct {
	// Open are the connections served now (displaced ones still closing
	// not included).
	Open int
	// Displaced counts connections closed to make room for a new one,
	// Refused new ones turned away (answered 503, or closed unanswered
	// while 256 others were being answered), since the Server started.
	Displaced, Refused uint64
}

// ConnStats returns the counts of the connections HTTPServer's listener
// admitted.
func (s *Server) ConnStats() ConnStats {
	g := s.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	return ConnStats{Open: g.open, Displaced: g.displaced.Load(), Refused: g.refused.Load()}
}

// guard admits and tracks connections.
type guard struct {
	lim Limits

	mu    sync.Mutex
	conns map[*guardConn]struct{}
	open  int // conns not displaced

	refusing  atomic.Int32
	displaced atomic.Uint64
	refused   atomic.Uint64
}

func newGuard(lim Limits) *guard {
	return &guard{lim: lim, conns: map[*guardConn]struct{}{}}
}

type connKey struct{}

// connOf is the guarded connection r arrived on, or nil.
func connOf(r *http.Request) *guardConn {
	gc, _ := r.Context().Value(connKey{}).(*guardConn)
	return gc
}

// guardListener admits each accepted connection, or refuses it.
type guardListener struct {
	net.Listener
	g *guard
}

func (l *guardListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(nc); gc != nil {
			return gc, nil
		}
	}
}

// admit tracks nc, displacing a connection if the guard is full; nil if
// there is no room (nc is then being refused).
func (g *guard) admit(nc net.Conn) *guardConn {
	now := time.Now()
	g.mu.Lock()
	if g.open >= g.lim.MaxConns {
		victim := g.victimLocked(now)
		if victim == nil {
			g.mu.Unlock()
			g.refuse(nc)
			return nil
		}
		victim.displace()
		g.open--
		g.displaced.Add(1)
	}
	gc := &guardConn{Conn: nc, g: g, waiting: true, since: now}
	g.conns[gc] = struct{}{}
	g.open++
	g.mu.Unlock()
	return gc
}

// victimLocked is the connection that has waited longest for its request,
// if it has for more than evictAfter and received less than MinBodyRate
// meanwhile, or nil.
func (g *guard) victimLocked(now time.Time) *guardConn {
	var victim *guardConn
	for c := range g.conns {
		if !c.waiting || c.isDisplaced() {
			continue
		}
		waited := now.Sub(c.since)
		if waited < evictAfter {
			continue
		}
		if got := c.read.Load() - c.sinceRead; float64(got) >= float64(g.lim.MinBodyRate)*waited.Seconds() {
			continue
		}
		if victim == nil || c.since.Before(victim.since) {
			victim = c
		}
	}
	return victim
}

// connState follows a connection between requests: idle, it waits for
// its next request; closed, it leaves.
func (g *guard) connState(nc net.Conn, st http.ConnState) {
	gc, ok := nc.(*guardConn)
	if !ok {
		return
	}
	switch st {
	case http.StateIdle:
		g.wait(gc)
	case http.StateClosed, http.StateHijacked:
		g.mu.Lock()
		if _, live := g.conns[gc]; live {
			delete(g.conns, gc)
			if !gc.isDisplaced() {
				g.open--
			}
		}
		g.mu.Unlock()
	}
}

// wait marks gc as waiting for (or receiving) a request from now.
func (g *guard) wait(gc *guardConn) {
	g.mu.Lock()
	gc.waiting, gc.since, gc.sinceRead = true, time.Now(), gc.read.Load()
	g.mu.Unlock()
}

// serving marks r's connection as having received its request: a handler
// serves it, and it is no candidate for displacement.
func (g *guard) serving(r *http.Request) {
	if gc := connOf(r); gc != nil {
		g.mu.Lock()
		gc.waiting = false
		g.mu.Unlock()
	}
}

// refuse answers nc 503 and closes it, on a goroutine of its own.
func (g *guard) refuse(nc net.Conn) {
	g.refused.Add(1)
	if g.refusing.Add(1) > maxRefusing {
		g.refusing.Add(-1)
		nc.Close()
		return
	}
	go func() {
		defer g.refusing.Add(-1)
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(refuseTimeout))
		// The answer follows the request's headers: a client that reads
		// an answer before it has sent a request drops it as unsolicited.
		readHead(nc)
		body := fmt.Sprintf(`{"error":{"message":"the worker serves its maximum of %d connections; retry later","type":"ServiceUnavailableError","param":null,"code":503}}`+"\n", g.lim.MaxConns)
		fmt.Fprintf(nc, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// Close our side, then read what the client sends until it closes
		// its own, so that closing with its request unread does not reset
		// the connection before it reads the answer.
		if cw, ok := nc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		io.Copy(io.Discard, io.LimitReader(nc, 1<<20))
	}()
}

// readHead reads nc up to the end of a request's headers, at most 64 KiB,
// until its deadline.
func readHead(nc net.Conn) {
	buf := make([]byte, 4<<10)
	var tail []byte // the last bytes read, to find a terminator split between reads
	for total := 0; total < 64<<10; {
		n, err := nc.Read(buf)
		total += n
		tail = append(tail, buf[:n]...)
		if bytes.Contains(tail, []byte("\r\n\r\n")) || err != nil {
			return
		}
		tail = tail[max(0, len(tail)-3):]
	}
}

// guardConn is an admitted connection.
type guardConn struct {
	net.Conn
	g    *guard
	read atomic.Int64 // bytes read

	// Under g.mu.
	waiting   bool      // waiting for or receiving a request
	since     time.Time // when it began to
	sinceRead int64     // read then

	mu        sync.Mutex
	displaced bool
	deadline  time.Time // the read deadline in force
}

// pastDeadline wakes and fails reads.
var pastDeadline = time.Unix(1, 0)

// displace makes c's reads fail from now on: a request it is waiting for
// or receiving fails, and net/http closes it.
func (c *guardConn) displace() {
	c.mu.Lock()
	c.displaced = true
	c.Conn.SetReadDeadline(pastDeadline)
	c.mu.Unlock()
}

func (c *guardConn) isDisplaced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.displaced
}

// SetReadDeadline sets the read deadline, unless c is displaced.
func (c *guardConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.displaced {
		return nil
	}
	c.deadline = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines, the read one unless c is displaced.
func (c *guardConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// Read reads, and retries a read that timed out on a deadline moved later
// while it returned. That happens when a handler clears its body's
// deadline just as net/http starts its background read at the body's
// end: the read would fail and cancel the request it has just received.
func (c *guardConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		c.read.Add(int64(n))
		if n == 0 && isTimeout(err) && c.deadlineMoved() {
			continue
		}
		return n, err
	}
}

// deadlineMoved reports whether the read deadline in force has not passed.
func (c *guardConn) deadlineMoved() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.displaced && (c.deadline.IsZero() || time.Now().Before(c.deadline))
}

// Write writes p in pieces, each within WriteStallTimeout.
func (c *guardConn) Write(p []byte) (int, error) {
	var written int
	for len(p) > 0 {
		piece := p[:min(len(p), writeChunk)]
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.g.lim.WriteStallTimeout)); err != nil {
			return written, err
		}
		n, err := c.Conn.Write(piece)
		written += n
		p = p[n:]
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

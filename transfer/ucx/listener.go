//go:build ucx

package ucx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/internal/netserve"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// listener serves a Handler: one UCP worker for all its connections, and a
// TCP listener on which clients say hello and trade worker addresses.
// netserve admits, tracks and drains its connections (its sessions).
type listener struct {
	opts *Options
	h    transfer.Handler
	ln   net.Listener
	w    *worker
	srv  *netserve.Server[*session]
	stop sync.Once // frees the worker, once the connections are over

	mu      sync.Mutex
	ids     map[uint32]bool // ids in use
	nextID  uint32
	orphans []orphan

	byID map[uint32]*session // loop-only: where requests go
}

// Listen serves h on addr ("host:port"; port 0 picks a free one) until the
// Listener is closed.
func (t *Transport) Listen(addr string, h transfer.Handler) (transfer.Listener, error) {
	if t.err != nil {
		return nil, t.err
	}
	if h == nil {
		return nil, fmt.Errorf("ucx: listen on %s: nil Handler", addr)
	}
	lc := net.ListenConfig{KeepAlive: t.opts.KeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ucx: listen on %s: %w", addr, err)
	}
	w, err := startLoop("listener on "+ln.Addr().String(), t.settings, t.opts.BusyPoll)
	if err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("ucx: listen on %s: %w", addr, err)
	}
	l := &listener{opts: &t.opts, h: h, ln: ln, w: w,
		ids: make(map[uint32]bool), byID: make(map[uint32]*session)}
	l.srv = netserve.New(netserve.Config[*session]{
		MaxConns:    t.opts.MaxConns,
		MaxRefusing: frame.MaxRefusing,
		Accepted: func(c net.Conn) {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
		},
		Open:   func(c net.Conn) *session { return newSession(l, c) },
		Refuse: l.refuse,
	})
	_ = w.call(func() { w.probe = l.takeRequests })
	l.srv.Start(ln)
	return l, nil
}

// Addr returns the address the listener is bound to, with the port it got.
func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting, closes every live connection, waits for their
// goroutines, and so for the Handler calls in flight, to return, and frees
// the worker. Closing a closed listener waits the same way and returns nil.
func (l *listener) Close() error {
	err := l.srv.Close()
	l.free()
	if err != nil {
		return fmt.Errorf("ucx: close listener %s: %w", l.Addr(), err)
	}
	return nil
}

// Shutdown stops accepting, closes the connections still in their
// handshake, lets each connection answer the requests it has received —
// then closes it — and frees the worker (transfer.Drainer). When ctx ends
// first it closes what is left, as Close does, and returns ctx's error.
func (l *listener) Shutdown(ctx context.Context) error {
	err := l.srv.Shutdown(ctx)
	l.free()
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return fmt.Errorf("ucx: listener %s: requests cut at the shutdown deadline: %w", l.Addr(), err)
	default:
		return fmt.Errorf("ucx: close listener %s: %w", l.Addr(), err)
	}
}

// free stops the worker once the connections are over, which completes
// every op left: the orphans' buffers are free.
func (l *listener) free() {
	l.stop.Do(func() {
		l.w.stop()
		l.reapOrphans()
	})
}

// Lanes returns the UCX transports the listener's live connections use.
func (l *listener) Lanes() []Lane {
	var info []string
	l.w.mu.Lock()
	for _, s := range l.w.eps {
		info = append(info, l.w.epInfoLocked(s.ep))
	}
	l.w.mu.Unlock()
	var lanes []Lane
	for _, in := range info {
		lanes = mergeLanes(lanes, parseLanes(in))
	}
	return lanes
}

// refuse reads c's hello and answers with one that says why c is refused.
func (l *listener) refuse(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(min(l.opts.HandshakeTimeout, time.Second)))
	if _, _, err := readClientHello(c); err != nil {
		return
	}
	writeHello(c, frame.StatusUnavailable, frame.ConnLimitMsg(l.opts.MaxConns), 0, 0, nil)
}

// handshake reads the client's hello, connects an endpoint to its worker
// and answers with the connection's id and this worker's address. It
// reports whether the endpoint exists, even if the answer then failed.
func (l *listener) handshake(s *session) (opened bool, err error) {
	c := s.nc
	_ = c.SetDeadline(time.Now().Add(l.opts.HandshakeTimeout))
	ver, peer, err := readClientHello(c)
	switch {
	case err != nil:
		if errors.Is(err, frame.ErrProtocol) {
			writeHello(c, frame.StatusError, "not a kvstrata UCX data-plane hello: "+err.Error(), 0, 0, nil)
		}
		return false, err
	case ver != version:
		writeHello(c, frame.StatusRefused, fmt.Sprintf(
			"protocol version %d is not supported; this node speaks version %d", ver, version), 0, 0, nil)
		return false, frame.ErrProtocol
	}
	id := l.allocID()
	s.id = id
	var eerr error
	if err := l.w.call(func() {
		s.ep, eerr = l.w.openEPLocked(peer, func(ucsStatus) { s.kill() })
		if eerr == nil {
			l.byID[id] = s
		}
	}); err != nil {
		eerr = err
	}
	if eerr != nil {
		writeHello(c, frame.StatusError, "connecting an endpoint to the client's worker: "+eerr.Error(), 0, 0, nil)
		l.freeID(id)
		return false, eerr
	}
	if err := writeHello(c, frame.StatusOK, "", id, l.opts.ChunkSize, l.w.addr); err != nil {
		return true, err
	}
	_ = c.SetDeadline(time.Time{})
	return true, nil
}

// orphan is what a finished session still lent UCX: ops UCX has not
// completed, and the releases to run once it has.
type orphan struct {
	ops     []*op
	release func()
}

// orphan runs release once every op is done: now if they are, else when a
// later session ends or the listener closes and finds them done.
func (l *listener) orphan(ops []*op, release func()) {
	l.mu.Lock()
	l.orphans = append(l.orphans, orphan{ops, release})
	l.mu.Unlock()
	l.reapOrphans()
}

func (l *listener) reapOrphans() {
	var ready []func()
	l.mu.Lock()
	kept := l.orphans[:0]
	for _, o := range l.orphans {
		if allDone(o.ops) {
			ready = append(ready, o.release)
		} else {
			kept = append(kept, o)
		}
	}
	clear(l.orphans[len(kept):])
	l.orphans = kept
	l.mu.Unlock()
	for _, release := range ready {
		release()
	}
}

// allocID picks an id no live connection has; ids are not reused until the
// 24-bit counter wraps, so that stragglers of a closed connection cannot
// reach a new one.
func (l *listener) allocID() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		l.nextID = l.nextID%maxID + 1
		if !l.ids[l.nextID] {
			l.ids[l.nextID] = true
			return l.nextID
		}
	}
}

// freeID gives id back once its connection is over.
func (l *listener) freeID(id uint32) {
	l.mu.Lock()
	delete(l.ids, id)
	l.mu.Unlock()
}

// takeRequests runs on the loop (w.mu held) after every progress that did something:
// it takes the requests that arrived off the unexpected queue and receives
// each into a buffer of its own size, for its session. A request too large
// for any valid one is received into nothing (dropped, its size kept) so
// that the session can refuse it by its tag alone.
func (l *listener) takeRequests() {
	maxReq := requestSize + l.opts.MaxBlocks*frame.HeaderSize
	for {
		msg, n, stag := probe(l.w.c, reqTag, reqMask)
		if msg == nil {
			return
		}
		id, _, _, _ := splitTag(stag)
		s := l.byID[id]
		o := &op{kind: opMsgRecv, msg: msg}
		if s != nil && !s.deliver(o, stag) {
			s = nil // a client that does not wait for its answers
		}
		if s != nil {
			o.wk = s.wk
			if n <= maxReq {
				o.buf = make([]byte, n)
			}
		}
		l.w.startLocked(o)
	}
}

func readClientHello(c net.Conn) (ver uint8, addr []byte, err error) {
	var b [clientHelloSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, nil, err
	}
	ver, n, err := decodeClientHello(b[:])
	if err != nil {
		return ver, nil, err
	}
	addr = make([]byte, n)
	if _, err := io.ReadFull(c, addr); err != nil {
		return ver, nil, err
	}
	return ver, addr, nil
}

// writeHello writes a server hello with msg (cut to frame.MaxMsg bytes).
func writeHello(c net.Conn, st frame.Status, msg string, id uint32, chunk int, addr []byte) error {
	msg = frame.Clip(msg)
	b := make([]byte, serverHelloSize+len(msg)+len(addr))
	putServerHello(b, st, len(msg), id, chunk, len(addr))
	copy(b[serverHelloSize:], msg)
	copy(b[serverHelloSize+len(msg):], addr)
	_, err := c.Write(b)
	return err
}

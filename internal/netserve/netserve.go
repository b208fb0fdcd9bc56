// Package netserve runs the connection side of a network server, whatever
// its protocol: the accept loop with backoff, the connection limit, the
// tracking of live connections, and the two ways to stop — Close, which
// cuts everything at once, and Shutdown, which takes no new connection,
// lets the requests in flight finish and cuts the rest at its deadline.
//
// A protocol brings its connection type (a Conn: how to serve it, drain it,
// cut it) and its words for a connection turned away (Config.Refuse); the
// Server brings the rest. Every method of a Server is safe for concurrent
// use. The Server calls a Conn's Drain and Cut, and Config.Open and
// Config.Displace, with its lock held: they must not call back into the
// Server, and should not block.
package netserve

import (
	"context"
	"errors"
	"iter"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by Serve once the Server is stopping or stopped.
var ErrClosed = errors.New("netserve: server closed")

// Backoff bounds: after a failed Accept the loop waits MinBackoff, doubling
// the wait after each further failure up to MaxBackoff, as net/http does.
const (
	MinBackoff = 5 * time.Millisecond
	MaxBackoff = time.Second
)

// Conn is one connection of a protocol, as the Server tracks it.
type Conn interface {
	comparable
	// Serve runs the connection on its own goroutine until it is over, and
	// closes its socket before it returns.
	Serve()
	// Drain asks the connection to end once the request it is serving, if
	// any, is answered; one waiting for its next request ends now
	// (Shutdown).
	Drain()
	// Cut ends the connection now: Close, or Shutdown's deadline.
	Cut()
}

// Config says how a Server admits connections. Only Open is required.
type Config[C Conn] struct {
	// MaxConns is the most connections served at once. The default, 0,
	// means no limit.
	MaxConns int
	// MaxRefusing is the most connections being refused at once; beyond
	// it, connections over MaxConns are closed without a word. The
	// default, 0, means no limit.
	MaxRefusing int

	// Accepted, if set, sees every connection accepted, before it is
	// admitted or refused (to set socket options, to count it).
	Accepted func(nc net.Conn)
	// Open makes the protocol's connection for nc, to be served.
	Open func(nc net.Conn) C
	// Displace, if set, is asked for room when the Server is full: it may
	// pick one of the live connections it is offered, make it end, and
	// return it with true; the new connection then takes its place. The
	// displaced one no longer counts against MaxConns, though it stays
	// live until its Serve returns. It returns false to refuse the new one.
	Displace func(live iter.Seq[C]) (C, bool)
	// Refuse, if set, tells a connection over MaxConns why it is turned
	// away, on a goroutine of its own; the Server closes nc after it.
	// Shutdown lets a refusal finish; Close and the deadline cut it.
	Refuse func(nc net.Conn)
	// AcceptFailed, if set, hears of each failed Accept the loop retries,
	// and of how long it waits first.
	AcceptFailed func(ln net.Listener, err error, retry time.Duration)
}

// state is where a Server is in its life.
type state int32

const (
	open   state = iota
	drain        // Shutdown: no new connections, the live ones finish
	closed       // Close: everything cut
)

// Server admits and tracks the connections of any number of listeners.
type Server[C Conn] struct {
	cfg      Config[C]
	state    atomic.Int32
	draining atomic.Bool   // Shutdown has begun
	quit     chan struct{} // closed when the Server stops accepting

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	live      map[C]bool // served connections: true once displaced
	displaced int
	refusing  map[net.Conn]struct{}
	wg        sync.WaitGroup // Serve loops, connections and refusals
}

// New returns a Server that admits connections as cfg says.
func New[C Conn](cfg Config[C]) *Server[C] {
	return &Server[C]{cfg: cfg, quit: make(chan struct{}),
		listeners: map[net.Listener]struct{}{}, live: map[C]bool{},
		refusing: map[net.Conn]struct{}{}}
}

// Draining reports whether Shutdown has begun: connections read it to end
// at their next request boundary. It stays true once set, Close or not.
func (s *Server[C]) Draining() bool { return s.draining.Load() }

// Serve accepts connections on ln until the Server stops, then closes ln
// and returns ErrClosed. A failed Accept is retried after a backoff
// (MinBackoff, doubling to MaxBackoff); if ln is closed by someone else,
// Serve returns that error.
func (s *Server[C]) Serve(ln net.Listener) error {
	if !s.add(ln) {
		return ErrClosed
	}
	return s.acceptLoop(ln)
}

// Start serves ln as Serve does, on a goroutine of its own; Close and
// Shutdown wait for it. Once the Server stops, Start closes ln.
func (s *Server[C]) Start(ln net.Listener) {
	if s.add(ln) {
		go func() { _ = s.acceptLoop(ln) }()
	}
}

// add registers ln, or closes it and reports false if the Server stopped.
func (s *Server[C]) add(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state(s.state.Load()) != open {
		_ = ln.Close()
		return false
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server[C]) acceptLoop(ln net.Listener) error {
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
		s.wg.Done()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if state(s.state.Load()) != open {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors or a similar passing trouble: wait
			// a little instead of spinning.
			backoff = min(max(2*backoff, MinBackoff), MaxBackoff)
			if s.cfg.AcceptFailed != nil {
				s.cfg.AcceptFailed(ln, err, backoff)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.quit:
				t.Stop()
			}
			continue
		}
		backoff = 0
		if s.cfg.Accepted != nil {
			s.cfg.Accepted(nc)
		}
		s.admit(nc)
	}
}

// admit starts serving nc, or refusing it when the Server is full.
func (s *Server[C]) admit(nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state(s.state.Load()) != open {
		_ = nc.Close()
		return
	}
	if s.cfg.MaxConns > 0 && len(s.live)-s.displaced >= s.cfg.MaxConns && !s.displaceLocked() {
		if s.cfg.MaxRefusing > 0 && len(s.refusing) >= s.cfg.MaxRefusing {
			_ = nc.Close()
			return
		}
		s.refusing[nc] = struct{}{}
		s.wg.Add(1)
		go s.refuse(nc)
		return
	}
	c := s.cfg.Open(nc)
	s.live[c] = false
	s.wg.Add(1)
	go s.serve(c)
}

// displaceLocked asks Config.Displace for a connection to end, and
// reports whether it gave one.
func (s *Server[C]) displaceLocked() bool {
	if s.cfg.Displace == nil {
		return false
	}
	victim, ok := s.cfg.Displace(func(yield func(C) bool) {
		for c, gone := range s.live {
			if !gone && !yield(c) {
				return
			}
		}
	})
	if !ok {
		return false
	}
	if gone, live := s.live[victim]; live && !gone {
		s.live[victim] = true
		s.displaced++
	}
	return true
}

func (s *Server[C]) serve(c C) {
	defer s.wg.Done()
	c.Serve()
	s.mu.Lock()
	if s.live[c] {
		s.displaced--
	}
	delete(s.live, c)
	s.mu.Unlock()
}

func (s *Server[C]) refuse(nc net.Conn) {
	defer s.wg.Done()
	if s.cfg.Refuse != nil {
		s.cfg.Refuse(nc)
	}
	_ = nc.Close()
	s.mu.Lock()
	delete(s.refusing, nc)
	s.mu.Unlock()
}

// Len returns the number of live connections, the displaced ones still
// ending included.
func (s *Server[C]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Conns returns the live connections, in no order.
func (s *Server[C]) Conns() []C {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]C, 0, len(s.live))
	for c := range s.live {
		cs = append(cs, c)
	}
	return cs
}

// Close stops the Server: it closes the listeners, cuts every connection
// and refusal, and waits for them to end. It returns what closing the
// listeners failed with. Close may follow Shutdown, to cut what it waits
// for; after Close, it waits the same way and returns nil.
func (s *Server[C]) Close() error {
	s.mu.Lock()
	if state(s.state.Load()) == closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.stopLocked(closed)
	s.cutLocked()
	err := s.closeListenersLocked()
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// Shutdown stops the Server gracefully: it closes the listeners, asks each
// connection to Drain, and waits for the connections and refusals to end.
// If ctx ends first, it cuts what is left, waits for it, and returns ctx's
// error (joined to any from closing the listeners). After Close, Shutdown
// waits for Close and returns nil.
func (s *Server[C]) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	var err error
	switch state(s.state.Load()) {
	case closed:
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	case open:
		// Every connection is told before a client can see the listener
		// closed: one that sees it finds its connection draining too.
		s.draining.Store(true)
		s.stopLocked(drain)
		for c, gone := range s.live {
			if !gone {
				c.Drain()
			}
		}
		err = s.closeListenersLocked()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return err
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.cutLocked()
	s.mu.Unlock()
	<-done
	return errors.Join(err, ctx.Err())
}

// stopLocked moves the Server to st: it admits no new connection.
func (s *Server[C]) stopLocked(st state) {
	if state(s.state.Swap(int32(st))) == open {
		close(s.quit)
	}
}

// closeListenersLocked closes the listeners; their loops end.
func (s *Server[C]) closeListenersLocked() error {
	var errs []error
	for ln := range s.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cutLocked cuts every connection and refusal.
func (s *Server[C]) cutLocked() {
	for c := range s.live {
		c.Cut()
	}
	for nc := range s.refusing {
		_ = nc.Close()
	}
}

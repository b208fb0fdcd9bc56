package resp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/internal/netserve"
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("resp: server closed")

// Server serves a Store over RESP2. Create it with NewServer, give it
// listeners with Serve, stop it with Shutdown (gracefully) or Close.
type Server struct {
	store Store
	cond  ConditionalSetter // store's optional power, or nil
	cfg   Config
	cmds  *commandTable
	start time.Time
	runID string

	ks KeyStore // store's optional powers, or nil
	// reserver is the store's optional power to take a plain SET's value
	// straight into place, or nil.
	reserver SetReserver

	ctx    context.Context // cancelled by Close; passed to the Store
	cancel context.CancelFunc

	// net accepts, limits (evicting for room, else refusing), tracks and
	// drains the connections; its Draining says that connections end at
	// their next command boundary.
	net     *netserve.Server[*conn]
	pending *budget
	lastID  atomic.Uint64

	st counters
}

// counters are the server's statistics, updated lock-free.
type counters struct {
	calls                         []atomic.Uint64 // by command id
	unknown, accepted, rejected   atomic.Uint64
	protocolErrors, errorReplies  atomic.Uint64
	hits, misses, netIn, netOut   atomic.Uint64
	commandsProcessed, idleClosed atomic.Uint64
	slowClosed, busyClosed        atomic.Uint64
	evicted                       atomic.Uint64
}

// Stats is a snapshot of a Server's counters, for metrics.
type Stats struct {
	// Commands counts calls per command, by lower-case name ("get",
	// "client"), whether they succeeded or not; commands never called are
	// left out. Calls of unknown commands are in UnknownCommands.
	Commands            map[string]uint64
	UnknownCommands     uint64
	ConnectedClients    int
	AcceptedConnections uint64 // since start, the rejected ones included
	RejectedConnections uint64 // over MaxClients
	IdleClosed          uint64 // closed after IdleTimeout
	// SlowClosed counts connections closed because a command did not
	// arrive within CommandTimeout and MinReadRate's allowance.
	SlowClosed uint64
	// EvictedClients counts connections closed to make room for a new one
	// while the server was at MaxClients.
	EvictedClients uint64
	// BusyClosed counts connections closed because their command waited
	// too long for memory under MaxPendingBytes.
	BusyClosed uint64
	// PendingBytes is the memory held now, under MaxPendingBytes, by
	// commands not yet received whole (a connection's first 64 KiB apart).
	PendingBytes   int64
	ProtocolErrors uint64 // connections closed for malformed input
	ErrorReplies   uint64
	KeyspaceHits   uint64 // GET and MGET keys found
	KeyspaceMisses uint64
	NetInputBytes  uint64
	NetOutputBytes uint64
}

// NewServer returns a Server for store; cfg nil means the defaults.
func NewServer(store Store, cfg *Config) (*Server, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		store:   store,
		cfg:     c,
		cmds:    newCommandTable(),
		start:   time.Now(),
		runID:   newRunID(),
		ctx:     ctx,
		cancel:  cancel,
		pending: newBudget(c.MaxPendingBytes),
	}
	s.net = netserve.New(netserve.Config[*conn]{
		MaxConns: c.MaxClients,
		Accepted: func(net.Conn) { s.st.accepted.Add(1) },
		Open:     func(nc net.Conn) *conn { return newConn(s, nc, s.lastID.Add(1)) },
		Displace: s.victim,
		Refuse:   s.refuse,
		AcceptFailed: func(ln net.Listener, err error, retry time.Duration) {
			s.cfg.Logger.Warn("resp: accept failed; retrying", "addr", ln.Addr().String(), "err", err, "retry_in", retry)
		},
	})
	s.cond, _ = store.(ConditionalSetter)
	s.ks, _ = store.(KeyStore)
	s.reserver, _ = store.(SetReserver)
	s.st.calls = make([]atomic.Uint64, len(s.cmds.list))
	return s, nil
}

// ListenAndServe listens on the TCP address addr and serves it until
// Close; see Serve.
func (s *Server) ListenAndServe(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("resp: listen on %s: %w", addr, err)
	}
	return s.Serve(ln)
}

// Serve accepts connections on ln and serves each in its own goroutine
// until Close, when it returns ErrServerClosed. It closes ln on return.
// Errors accepting are logged and retried with backoff; Serve returns
// early only if ln is closed by someone else.
func (s *Server) Serve(ln net.Listener) error {
	err := s.net.Serve(ln)
	if errors.Is(err, netserve.ErrClosed) {
		return ErrServerClosed
	}
	return fmt.Errorf("resp: accept on %s: %w", ln.Addr(), err)
}

// refuse tells a client over MaxClients, for which no connection could be
// evicted, that the server is full.
func (s *Server) refuse(nc net.Conn) {
	s.st.rejected.Add(1)
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	n, _ := io.WriteString(nc, "-ERR max number of clients reached\r\n")
	s.st.netOut.Add(uint64(n))
	lingerClose(nc)
}

// victim picks, among the live connections, the one a full server closes
// to serve a new one, and evicts it: the one whose command has arrived
// slowest, under MinReadRate, for more than evictGrace; else the one that
// has waited longest between commands, if more than CommandTimeout; else
// none. A connection waiting for memory is the server's doing and is
// spared. It runs under the netserve Server's lock.
func (s *Server) victim(live iter.Seq[*conn]) (*conn, bool) {
	now := time.Now()
	var slow, idle *conn
	slowest := float64(s.cfg.MinReadRate)
	longest := s.cfg.CommandTimeout
	for c := range live {
		if st := c.rd.started.Load(); st != 0 {
			took := now.Sub(time.Unix(0, st))
			if took < evictGrace || c.rd.waiting.Load() {
				continue
			}
			if rate := float64(c.rd.got.Load()) / took.Seconds(); rate < slowest {
				slow, slowest = c, rate
			}
			continue
		}
		if d := now.Sub(time.Unix(0, c.active.Load())); d > longest && c.isIdle() {
			idle, longest = c, d
		}
	}
	victim := slow
	if victim == nil {
		victim = idle
	}
	if victim == nil {
		return nil, false
	}
	victim.evict()
	return victim, true
}

// Shutdown stops the server gracefully. It closes the listeners and every
// connection waiting for its next command; a connection in the middle of a
// command — reading it, running it or writing the reply — finishes it, and
// the commands already received behind it, writes the replies and then
// closes. If ctx ends first, Shutdown closes what is left as Close does
// and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error { return s.stop(ctx, true) }

// Close stops the server: it closes the listeners and every connection,
// cancels the context passed to the Store and waits for the connection
// goroutines to end. Replies not yet written are lost. Close is
// idempotent.
func (s *Server) Close() error { return s.stop(context.Background(), false) }

// stop closes the listeners and ends the connections: at their next
// command boundary when graceful (until ctx ends), else at once.
func (s *Server) stop(ctx context.Context, graceful bool) error {
	var err error
	if graceful {
		err = s.net.Shutdown(ctx)
		s.cancel()
	} else {
		s.cancel() // stop the Store's work for the connections being cut
		err = s.net.Close()
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return fmt.Errorf("resp: connections cut at the shutdown deadline: %w", err)
	default:
		return fmt.Errorf("resp: close listeners: %w", err)
	}
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Commands:            map[string]uint64{},
		UnknownCommands:     s.st.unknown.Load(),
		ConnectedClients:    s.clientCount(),
		AcceptedConnections: s.st.accepted.Load(),
		RejectedConnections: s.st.rejected.Load(),
		IdleClosed:          s.st.idleClosed.Load(),
		SlowClosed:          s.st.slowClosed.Load(),
		EvictedClients:      s.st.evicted.Load(),
		BusyClosed:          s.st.busyClosed.Load(),
		PendingBytes:        s.pending.inUse(),
		ProtocolErrors:      s.st.protocolErrors.Load(),
		ErrorReplies:        s.st.errorReplies.Load(),
		KeyspaceHits:        s.st.hits.Load(),
		KeyspaceMisses:      s.st.misses.Load(),
		NetInputBytes:       s.st.netIn.Load(),
		NetOutputBytes:      s.st.netOut.Load(),
	}
	for i, cmd := range s.cmds.list {
		if n := s.st.calls[i].Load(); n > 0 {
			st.Commands[cmd.name] = n
		}
	}
	return st
}

func (s *Server) clientCount() int { return s.net.Len() }

// clients returns the connections being served, in no order.
func (s *Server) clients() []*conn { return s.net.Conns() }

// lingerClose closes nc after a last reply: it shuts down the sending side
// and reads what the client still sends for a moment, so that closing does
// not reset the connection and destroy the reply before the client reads
// it.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		io.CopyN(io.Discard, nc, 1<<20)
	}
	nc.Close()
}

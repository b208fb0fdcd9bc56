package raftstore

import (
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// ConnGuard secures the raft transport's connections — TLS, a proof that
// the peer is a member — before raft speaks on them. Both calls return
// the connection to use, or an error after closing c.
type ConnGuard interface {
	// Server secures a connection a peer opened.
	Server(c net.Conn) (net.Conn, error)
	// Client secures a connection this node opened to the peer at addr.
	Client(c net.Conn, addr string) (net.Conn, error)
}

// guardedStream is raft's stream layer over TCP with a ConnGuard: an
// accepted connection is secured on its first read or write, on the
// goroutine raft serves it from, so that one slow peer does not hold up
// the accept loop.
type guardedStream struct {
	net.Listener
	advertise net.Addr
	guard     ConnGuard
}

var _ raft.StreamLayer = (*guardedStream)(nil)

func (s *guardedStream) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lazyConn{Conn: c, guard: s.guard}, nil
}

func (s *guardedStream) Addr() net.Addr { return s.advertise }

func (s *guardedStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return s.guard.Client(c, string(addr))
}

// lazyConn is an accepted connection that is secured on first use.
type lazyConn struct {
	net.Conn
	guard ConnGuard
	once  sync.Once
	err   error
}

func (c *lazyConn) secure() error {
	c.once.Do(func() {
		sc, err := c.guard.Server(c.Conn)
		if err != nil {
			c.err = err
			return
		}
		c.Conn = sc
	})
	return c.err
}

func (c *lazyConn) Read(b []byte) (int, error) {
	if err := c.secure(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *lazyConn) Write(b []byte) (int, error) {
	if err := c.secure(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// Package zmtpguard is a TCP transport for go-zeromq/zmq4 sockets that
// checks what a peer sends before zmq4 reads it.
//
// zmq4 trusts the peer: a frame header's length goes straight to
// make([]byte, size), in a goroutine of the library, so that any peer
// that can reach a socket — or any endpoint a socket dials — can crash
// the process (a length above the address space panics) or make it
// allocate gigabytes. zmq4 also does a listening socket's handshake in
// its accept loop without a deadline (one silent peer stalls every later
// one) and leaves the connection open when the handshake fails.
//
// The guard sits at the net.Conn under zmq4: its Read passes the inbound
// bytes through a Parser, which follows the greeting and the frames
// incrementally, and fails the connection (Read returns an error and the
// connection is closed) before zmq4 is handed a header that announces a
// message over the limit, or bytes that are not ZMTP 3 with the NULL
// mechanism. A connection whose handshake does not finish within a
// timeout, or whose peer does not take a write within another, is
// closed; a listener holds at most MaxConns connections and closes the
// ones over that at accept.
//
// Register adds the transport to zmq4 under Scheme; Endpoint rewrites a
// tcp:// endpoint to it, and WithLimits puts a socket's limits in the
// context the socket is made with (zmq4 passes that context to the
// transport). Everything here is safe for concurrent use.
package zmtpguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Scheme is the endpoint scheme the guarded TCP transport is registered
// under.
const Scheme = "kvstrata-tcp"

var (
	// ErrMalformed: the peer sent bytes that are not ZMTP 3 with the NULL
	// mechanism.
	ErrMalformed = errors.New("zmtpguard: malformed ZMTP stream")
	// ErrTooLarge: the peer announced a message over the limits.
	ErrTooLarge = errors.New("zmtpguard: message over the limit")
	// ErrTooManyConns: a listener refused a connection over MaxConns.
	ErrTooManyConns = errors.New("zmtpguard: too many connections")
	// ErrHandshakeTimeout: the peer did not finish the ZMTP handshake in
	// time.
	ErrHandshakeTimeout = errors.New("zmtpguard: handshake timed out")
	// ErrWriteTimeout: the peer did not take what was sent to it in time.
	ErrWriteTimeout = errors.New("zmtpguard: write timed out")
)

// Limits bound what one socket accepts from its peers.
type Limits struct {
	// MaxMessage is the most body bytes of one inbound message (the sum of
	// its frames) or command. The default is 64 KiB: enough for
	// subscriptions and replay requests, what listening sockets receive.
	MaxMessage int64
	// MaxFrames is the most frames of one inbound message. The default
	// is 16.
	MaxFrames int
	// MaxConns is how many connections a listening socket holds at once;
	// those over it are closed at accept. The default is 1024.
	MaxConns int
	// HandshakeTimeout bounds the ZMTP handshake of each connection;
	// past it the connection is closed. The default is 10 s.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each write to a peer; past it the connection is
	// closed. zmq4's PUB socket writes to its subscribers one after the
	// other: one that stops reading would hold up all the others. The
	// default is 10 s.
	WriteTimeout time.Duration
	// OnReject, if not nil, is told of each connection the guard closed,
	// with the reason (wrapping one of the errors above). It is called
	// from zmq4's goroutines and must not block.
	OnReject func(error)
	// OnClose, if not nil, is told once of each connection's close,
	// whatever closed it (the peer, the guard, the socket). It is called
	// from zmq4's goroutines and must not block.
	OnClose func()
}

// EnsureDefaults fills zero fields with their documented defaults.
func (l *Limits) EnsureDefaults() {
	if l.MaxMessage <= 0 {
		l.MaxMessage = 64 << 10
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = 16
	}
	if l.MaxConns <= 0 {
		l.MaxConns = 1024
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = 10 * time.Second
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = 10 * time.Second
	}
}

type limitsKey struct{}

// WithLimits returns a context carrying lim, for making a zmq4 socket
// whose guarded connections obey it.
func WithLimits(ctx context.Context, lim Limits) context.Context {
	return context.WithValue(ctx, limitsKey{}, lim)
}

func limitsOf(ctx context.Context) Limits {
	lim, _ := ctx.Value(limitsKey{}).(Limits)
	lim.EnsureDefaults()
	return lim
}

var (
	registerOnce sync.Once
	registerErr  error
)

// Register adds the guarded transport to zmq4 under Scheme, once per
// process; later calls return the first call's result.
func Register() error {
	registerOnce.Do(func() {
		if err := zmq4.RegisterTransport(Scheme, guarded{transport.New("tcp")}); err != nil {
			registerErr = fmt.Errorf("zmtpguard: register %s: %w", Scheme, err)
		}
	})
	return registerErr
}

// Endpoint returns ep with its tcp:// scheme replaced by Scheme; other
// endpoints are returned as they are.
func Endpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return Scheme + "://" + rest
	}
	return ep
}

package kvevents

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvstrata/kvstrata/engine/kvevents/internal/zmtpguard"
)

// pubSocket is what a Publisher needs of its PUB socket.
type pubSocket interface {
	SendMulti(zmq4.Msg) error
	Addr() net.Addr
	Close() error
}

var (
	_ pubSocket = zmq4.Socket(nil)
	_ pubSocket = (*dialedPub)(nil)
)

// dialedPub is the PUB socket of a Publisher with Connect: a zmq4 PUB
// socket that dials the endpoint, and, when its connection closes, a new
// one that dials again after RetryInterval. A socket per connection, not
// zmq4's automatic reconnection: that dials again once and gives up for
// good if the handshake fails. What is sent while no connection is up is
// dropped, as a PUB socket drops what no subscriber hears; the router sees
// the gap and replays it.
type dialedPub struct {
	p      *Publisher
	addr   net.Addr
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	cur zmq4.Socket // nil between sockets
}

func newDialedPub(p *Publisher) *dialedPub {
	ctx, cancel := context.WithCancel(context.Background())
	d := &dialedPub{p: p, cancel: cancel, done: make(chan struct{}), addr: endpointAddr(p.cfg.Endpoint)}
	go d.run(ctx)
	return d
}

// endpointAddr is a ZMQ endpoint's address part, as a net.Addr.
func endpointAddr(ep string) net.Addr {
	_, addr, _ := strings.Cut(ep, "://")
	return dialAddr(addr)
}

type dialAddr string

func (a dialAddr) Network() string { return "tcp" }
func (a dialAddr) String() string  { return string(a) }

// run dials, waits for the connection to close, and dials again, until
// ctx ends.
func (d *dialedPub) run(ctx context.Context) {
	defer close(d.done)
	cfg := d.p.cfg
	for ctx.Err() == nil {
		lost := make(chan struct{})
		var once sync.Once
		sctx := zmtpguard.WithLimits(ctx, zmtpguard.Limits{
			MaxMessage: maxRequest, HandshakeTimeout: cfg.HandshakeTimeout, WriteTimeout: cfg.WriteTimeout,
			OnReject: d.p.onReject, OnClose: func() { once.Do(func() { close(lost) }) },
		})
		sock := zmq4.NewPub(sctx, zmq4.WithLogger(zmqLog),
			zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(cfg.RetryInterval))
		if err := sock.SetOption(zmq4.OptionHWM, cfg.HWM); err == nil {
			d.swap(sock)
			if sock.Dial(zmtpguard.Endpoint(cfg.Endpoint)) == nil {
				select {
				case <-lost:
				case <-ctx.Done():
				}
			}
		}
		d.swap(nil)
		sock.Close()
		select {
		case <-time.After(cfg.RetryInterval):
		case <-ctx.Done():
		}
	}
}

func (d *dialedPub) swap(sock zmq4.Socket) {
	d.mu.Lock()
	d.cur = sock
	d.mu.Unlock()
}

// SendMulti sends msg on the current socket; nothing while there is none.
func (d *dialedPub) SendMulti(msg zmq4.Msg) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil {
		return nil
	}
	return d.cur.SendMulti(msg)
}

func (d *dialedPub) Addr() net.Addr { return d.addr }

func (d *dialedPub) Close() error {
	d.cancel()
	<-d.done
	return nil
}

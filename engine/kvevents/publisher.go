package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvstrata/kvstrata/engine/kvevents/internal/zmtpguard"
)

// PublisherConfig configures a Publisher. Its zero value is not usable:
// Endpoint is required.
type PublisherConfig struct {
	// Endpoint is where the PUB socket listens, e.g. "tcp://127.0.0.1:5557"
	// (vLLM's default port), or with Connect the endpoint it connects to.
	// Required.
	Endpoint string
	// Connect makes the PUB socket connect to Endpoint — a router's
	// listening SUB socket (kvevents.Listener) — instead of listening, and
	// connect again, every RetryInterval, while it is not connected. Its
	// Topic is then what tells its messages from other workers'. The
	// replay socket listens either way.
	Connect bool
	// RetryInterval is the wait between attempts to connect, with
	// Connect. The default is 250 ms.
	RetryInterval time.Duration
	// ReplayEndpoint is where the ROUTER socket answering replay requests
	// listens, e.g. "tcp://127.0.0.1:5558". Empty: no replay socket.
	ReplayEndpoint string
	// Topic is the first frame of every message. The default is "", as vLLM's.
	Topic string
	// Encoding is how events are written. The default is TaggedArrays.
	Encoding Encoding
	// BufferSteps is how many past batches the replay socket can resend.
	// The default is 10000, as vLLM's buffer_steps.
	BufferSteps int
	// HWM is how many messages the PUB socket queues before it drops new
	// ones (subscribers see a gap in the sequence numbers and replay it).
	// The default is 100000, as vLLM's hwm.
	HWM int
	// MaxConns is how many connections each of the two sockets holds at
	// once; a connection over it is closed as it is accepted, so that a
	// flood of connections cannot exhaust memory or file descriptors. The
	// default is 1024.
	MaxConns int
	// HandshakeTimeout bounds each connection's ZMTP handshake; past it
	// the connection is closed. zmq4 accepts connections one at a time,
	// handshake included: a peer that connects and says nothing holds up
	// the connections after it for this long. The default is 10 s.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each write to a subscriber or replay client;
	// past it the connection is closed. zmq4's PUB socket writes to its
	// subscribers one after the other: one that stops reading would hold
	// up every other. The default is 10 s.
	WriteTimeout time.Duration
}

// maxRequest bounds each inbound message of the Publisher's sockets: they
// receive only subscriptions (a topic) and replay requests (8 bytes).
const maxRequest = 64 << 10

// zmqLog is the logger of every zmq4 socket here: zmq4 logs a line for
// each connection whose handshake fails, which a peer can cause at will.
var zmqLog = zmtpguard.Logger(nil, 10*time.Second)

// EnsureDefaults fills zero fields with their documented defaults.
func (c *PublisherConfig) EnsureDefaults() {
	if c.BufferSteps == 0 {
		c.BufferSteps = 10000
	}
	if c.HWM == 0 {
		c.HWM = 100000
	}
	if c.MaxConns == 0 {
		c.MaxConns = 1024
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = 250 * time.Millisecond
	}
}

// Validate reports what is wrong with c.
func (c *PublisherConfig) Validate() error {
	var errs []error
	if c.Endpoint == "" {
		errs = append(errs, errors.New("kvevents: Endpoint: required"))
	}
	if c.Encoding != TaggedArrays && c.Encoding != Maps {
		errs = append(errs, fmt.Errorf("kvevents: Encoding: unknown %v", c.Encoding))
	}
	if c.BufferSteps < 0 {
		errs = append(errs, fmt.Errorf("kvevents: BufferSteps: %d is negative", c.BufferSteps))
	}
	if c.HWM < 0 {
		errs = append(errs, fmt.Errorf("kvevents: HWM: %d is negative", c.HWM))
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("kvevents: MaxConns: %d is negative", c.MaxConns))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("kvevents: HandshakeTimeout: %v is negative", c.HandshakeTimeout))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("kvevents: WriteTimeout: %v is negative", c.WriteTimeout))
	}
	if c.RetryInterval < 0 {
		errs = append(errs, fmt.Errorf("kvevents: RetryInterval: %v is negative", c.RetryInterval))
	}
	if c.Connect && c.Endpoint != "" {
		if err := checkEndpoint(c.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("kvevents: Endpoint: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Publisher publishes event batches as vLLM's ZmqEventPublisher does: on
// a PUB socket, each batch one message of Frames(topic, seq, payload)
// with sequence numbers from 0; and, when configured, answers replay
// requests on a ROUTER socket from a buffer of the last batches. Publish
// may be called from any goroutine; batches go out in the order of the
// calls.
//
// Both sockets listen through zmtpguard: a peer that sends anything but
// ZMTP, announces a message over 64 KiB, does not finish its handshake,
// stops reading, or connects over MaxConns has its connection closed
// (Stats counts it), and nothing else changes.
type Publisher struct {
	cfg    PublisherConfig
	pub    pubSocket
	replay zmq4.Socket // nil without a replay endpoint
	done   chan struct{}

	// sendMu is held from a batch's sequence number to its send, so that
	// Publish calls send in the order of their numbers.
	sendMu sync.Mutex
	mu     sync.Mutex
	seq    int64     // the next batch's sequence number
	ring   []message // the last BufferSteps messages, oldest first

	badPeers, refused atomic.Uint64
}

// PublisherStats counts the connections a Publisher closed.
type PublisherStats struct {
	BadPeers uint64 // connections that broke ZMTP, its size limits, the handshake or the write timeout
	Refused  uint64 // connections over MaxConns, closed at accept
}

// Stats returns the counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{BadPeers: p.badPeers.Load(), Refused: p.refused.Load()}
}

// onReject counts a connection the guard closed.
func (p *Publisher) onReject(err error) {
	if errors.Is(err, zmtpguard.ErrTooManyConns) {
		p.refused.Add(1)
	} else {
		p.badPeers.Add(1)
	}
}

// socketContext is the context the Publisher's sockets are made with.
func (p *Publisher) socketContext() context.Context {
	return zmtpguard.WithLimits(context.Background(), zmtpguard.Limits{
		MaxMessage: maxRequest, MaxConns: p.cfg.MaxConns, HandshakeTimeout: p.cfg.HandshakeTimeout,
		WriteTimeout: p.cfg.WriteTimeout, OnReject: p.onReject,
	})
}

type message struct {
	seq     int64
	payload []byte
}

// NewPublisher opens the sockets that cfg names (a copy of cfg, with
// defaults filled in, is kept).
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := zmtpguard.Register(); err != nil {
		return nil, err
	}
	p := &Publisher{cfg: cfg, done: make(chan struct{})}
	if cfg.Connect {
		p.pub = newDialedPub(p)
	} else {
		pub := zmq4.NewPub(p.socketContext(), zmq4.WithLogger(zmqLog))
		if err := pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
			pub.Close()
			return nil, fmt.Errorf("kvevents: PUB high-water mark %d: %w", cfg.HWM, err)
		}
		if err := pub.Listen(zmtpguard.Endpoint(cfg.Endpoint)); err != nil {
			pub.Close()
			return nil, fmt.Errorf("kvevents: listen %s: %w", cfg.Endpoint, err)
		}
		p.pub = pub
	}
	if cfg.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.replay = zmq4.NewRouter(p.socketContext(), zmq4.WithLogger(zmqLog))
	if err := p.replay.Listen(zmtpguard.Endpoint(cfg.ReplayEndpoint)); err != nil {
		p.pub.Close()
		p.replay.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", cfg.ReplayEndpoint, err)
	}
	go p.serveReplay()
	return p, nil
}

// Addr is where the PUB socket listens (with the port chosen, for ":0"),
// or with Connect the address it connects to.
func (p *Publisher) Addr() string { return p.pub.Addr().String() }

// ReplayAddr is where the replay socket listens; "" without one.
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return p.replay.Addr().String()
}

// Publish encodes b, sends it and keeps it for replay. It returns the
// batch's sequence number. A batch that fails to send keeps its number
// and its place in the replay buffer: subscribers see a gap and replay it.
func (p *Publisher) Publish(b *Batch) (int64, error) {
	payload, err := Encode(b, p.cfg.Encoding)
	if err != nil {
		return 0, err
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	m := p.record(payload)
	return m.seq, p.send(m)
}

// record numbers an encoded batch and keeps it for replay, without
// sending it.
func (p *Publisher) record(payload []byte) message {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := message{p.seq, payload}
	p.seq++
	if p.cfg.BufferSteps > 0 {
		if len(p.ring) == p.cfg.BufferSteps {
			p.ring = p.ring[1:] // append moves what is left when it grows
		}
		p.ring = append(p.ring, m)
	}
	return m
}

// send sends a recorded batch on the PUB socket.
func (p *Publisher) send(m message) error {
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(Frames(p.cfg.Topic, m.seq, m.payload)...)); err != nil {
		return fmt.Errorf("kvevents: publish %d: %w", m.seq, err)
	}
	return nil
}

// serveReplay answers replay requests until the socket is closed. A
// malformed request is ignored, as vLLM ignores it.
func (p *Publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return
		}
		id, start, err := ParseReplayRequest(msg.Frames)
		if err != nil {
			continue
		}
		p.mu.Lock()
		var out []message
		for _, m := range p.ring {
			if m.seq >= start {
				out = append(out, m)
			}
		}
		p.mu.Unlock()
		for _, m := range append(out, message{EndSeq, nil}) {
			frames := append([][]byte{id, {}}, ReplayReply(m.seq, m.payload)...)
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
				break
			}
		}
	}
}

// Close closes the sockets. A connection of theirs closed already (a
// subscriber that hung up, whose connection a write closed) is no error.
func (p *Publisher) Close() error {
	err := closeErr(p.pub.Close())
	if p.replay != nil {
		err = errors.Join(err, closeErr(p.replay.Close()))
	}
	<-p.done
	return err
}

// closeErr is err from closing a socket, nil when it only says that a
// connection was closed before: what closing is for.
func closeErr(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvstrata/kvstrata/engine/kvevents/internal/zmtpguard"
)

// ErrTopicTaken: a Listener already has a Subscriber for that topic.
var ErrTopicTaken = errors.New("kvevents: topic already followed")

// ListenerConfig configures a Listener. Its zero value is not usable:
// Endpoint is required.
type ListenerConfig struct {
	// Endpoint is where the SUB socket listens, e.g. "tcp://0.0.0.0:5557";
	// workers' PUB sockets connect to it (vLLM's publisher connects when
	// its endpoint is not a wildcard bind). Required.
	Endpoint string
	// MaxMessage bounds each message heard, in bytes (the sum of its
	// frames): a peer that announces a larger one has its connection
	// closed (Stats' BadPeers). The default is 4 MiB, far above an engine
	// step's batch of events. Each connection holds one message at most
	// while it waits to be read, so MaxConns × MaxMessage bounds the
	// memory peers can make the socket hold.
	MaxMessage int64
	// MaxConns is how many connections the socket holds at once; one over
	// it is closed as it is accepted (Stats' Refused). The default is 256.
	MaxConns int
	// HandshakeTimeout bounds each connection's ZMTP handshake; past it
	// the connection is closed. The default is 10 s.
	HandshakeTimeout time.Duration
	// MaxQueued bounds, per Subscriber, the bytes of messages heard and
	// not yet handled (its callback, or a replay, may be slow): past it
	// a message is dropped (Stats' Dropped), and the Subscriber replays
	// it: when the next message shows the gap in the sequence numbers, as
	// after a publisher's high-water mark, or, if none has come, once it
	// has handled what was queued (the worker may send nothing more for a
	// while). The default is 64 MiB.
	MaxQueued int64
}

// EnsureDefaults fills zero fields with their documented defaults.
func (c *ListenerConfig) EnsureDefaults() {
	if c.MaxMessage == 0 {
		c.MaxMessage = 4 << 20
	}
	if c.MaxConns == 0 {
		c.MaxConns = 256
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 64 << 20
	}
}

// Validate reports what is wrong with c.
func (c *ListenerConfig) Validate() error {
	var errs []error
	if c.Endpoint == "" {
		errs = append(errs, errors.New("kvevents: Endpoint: required"))
	} else if err := checkEndpoint(c.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("kvevents: Endpoint: %w", err))
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"MaxMessage", c.MaxMessage}, {"MaxConns", int64(c.MaxConns)}, {"HandshakeTimeout", int64(c.HandshakeTimeout)}, {"MaxQueued", c.MaxQueued}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("kvevents: %s: %d is negative", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// ListenerStats counts what a Listener heard and what it turned away.
type ListenerStats struct {
	Heard        uint64 // messages handed to a Subscriber
	UnknownTopic uint64 // messages whose topic no Subscriber follows, dropped
	Malformed    uint64 // messages of other than three frames, dropped
	Dropped      uint64 // messages dropped because their Subscriber's queue was full
	BadPeers     uint64 // connections closed for breaking ZMTP, MaxMessage or the handshake timeout
	Refused      uint64 // connections over MaxConns, closed at accept
}

// Listener is the bind mode of KV-event intake: one SUB socket that
// listens, which many workers' PUB sockets connect to. A worker's
// messages are told from the others' by their topic (the first frame,
// vLLM's KVEventsConfig.topic): each worker's Subscriber, made by
// Subscriber with that topic, gets the messages of exactly that topic and
// handles them as a Subscriber of its own connection would — in sequence
// order, gaps replayed from the worker's replay socket (which the
// Subscriber dials), restarts reported. Messages of a topic no Subscriber
// follows are counted and dropped.
//
// The socket faces the network: it listens through zmtpguard (ZMTP
// checked before zmq4 reads it, MaxMessage, MaxConns, the handshake
// timeout), and each Subscriber's queue is bounded by MaxQueued, so that
// neither garbage nor a flood crashes the process or grows its memory
// without bound.
//
// Its methods are safe for concurrent use.
type Listener struct {
	cfg  ListenerConfig
	sub  zmq4.Socket
	done chan struct{}

	mu      sync.RWMutex
	inboxes map[string]*inbox

	closing atomic.Bool // set by Close: a Recv error is then the socket's end

	heard, unknown, malformed, dropped, badPeers, refused atomic.Uint64
}

// inbox is the queue of one topic's messages, from the Listener's
// receiving goroutine to its Subscriber's Run.
type inbox struct {
	topic  string
	ch     chan [][]byte
	queued atomic.Int64 // bytes in ch
	max    int64
	// dropped is the sequence number of the last message dropped that the
	// Subscriber has not yet caught up with (-1: none); kick wakes it
	// when ch may hold nothing that would.
	dropped atomic.Int64
	kick    chan struct{}
}

// NewListener listens on cfg's endpoint (a copy of cfg, with defaults
// filled in, is kept) and starts receiving. Close stops it.
func NewListener(cfg ListenerConfig) (*Listener, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := zmtpguard.Register(); err != nil {
		return nil, err
	}
	l := &Listener{cfg: cfg, done: make(chan struct{}), inboxes: map[string]*inbox{}}
	ctx := zmtpguard.WithLimits(context.Background(), zmtpguard.Limits{
		MaxMessage: cfg.MaxMessage, MaxConns: cfg.MaxConns, HandshakeTimeout: cfg.HandshakeTimeout, OnReject: l.onReject,
	})
	l.sub = zmq4.NewSub(ctx, zmq4.WithLogger(zmqLog))
	// Every topic: the Listener tells them apart itself, and counts those
	// it does not know.
	if err := l.sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		l.sub.Close()
		return nil, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := l.sub.Listen(zmtpguard.Endpoint(cfg.Endpoint)); err != nil {
		l.sub.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", cfg.Endpoint, err)
	}
	go l.receive()
	return l, nil
}

func (l *Listener) onReject(err error) {
	if errors.Is(err, zmtpguard.ErrTooManyConns) {
		l.refused.Add(1)
	} else {
		l.badPeers.Add(1)
	}
}

// Addr is where the socket listens (with the port chosen, for ":0").
func (l *Listener) Addr() string { return l.sub.Addr().String() }

// Stats returns the counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{
		Heard: l.heard.Load(), UnknownTopic: l.unknown.Load(), Malformed: l.malformed.Load(),
		Dropped: l.dropped.Load(), BadPeers: l.badPeers.Load(), Refused: l.refused.Load(),
	}
}

// Close closes the socket. Subscribers' Runs go on until their contexts
// end, hearing nothing more.
func (l *Listener) Close() error {
	l.closing.Store(true)
	err := l.sub.Close()
	<-l.done
	return err
}

// receive hands each message heard to its topic's inbox until the socket
// is closed.
func (l *Listener) receive() {
	defer close(l.done)
	for {
		msg, err := l.sub.Recv()
		switch {
		case l.closing.Load():
			return
		case err != nil:
			continue // one peer's connection ended; the others go on
		}
		l.dispatch(msg.Frames)
	}
}

// dispatch hands one message to the inbox of its topic.
func (l *Listener) dispatch(frames [][]byte) {
	if len(frames) != 3 {
		l.malformed.Add(1)
		return
	}
	l.mu.RLock()
	in := l.inboxes[string(frames[0])]
	l.mu.RUnlock()
	if in == nil {
		l.unknown.Add(1)
		return
	}
	size := int64(len(frames[0]) + len(frames[1]) + len(frames[2]))
	if in.queued.Add(size) > in.max {
		in.queued.Add(-size)
		l.drop(in, frames)
		return
	}
	select {
	case in.ch <- frames:
		l.heard.Add(1)
	default:
		in.queued.Add(-size)
		l.drop(in, frames)
	}
}

// drop drops a message of in's topic and tells its Subscriber which,
// for it to replay the message even if no later one shows the gap.
func (l *Listener) drop(in *inbox, frames [][]byte) {
	l.dropped.Add(1)
	if seq, err := ParseSeq(frames[1]); err == nil && seq >= 0 {
		in.dropped.Store(seq)
		select {
		case in.kick <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// Subscriber returns a Subscriber of the messages of topic cfg.Topic
// heard on the Listener: exactly that topic, not a prefix. cfg.Endpoint
// must be empty; cfg.ReplayEndpoint, if set, is the worker's replay
// socket, which the Subscriber dials. Run it as any Subscriber; when its
// Run returns, the topic is free for another. A topic already followed is
// an error wrapping ErrTopicTaken.
func (l *Listener) Subscriber(cfg SubscriberConfig) (*Subscriber, error) {
	if cfg.Endpoint != "" {
		return nil, fmt.Errorf("kvevents: Endpoint: %q: a Listener's subscriber hears the Listener's socket", cfg.Endpoint)
	}
	cfg.EnsureDefaults()
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	in := &inbox{topic: cfg.Topic, ch: make(chan [][]byte, 4096), max: l.cfg.MaxQueued, kick: make(chan struct{}, 1)}
	in.dropped.Store(-1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.inboxes[cfg.Topic]; ok {
		return nil, fmt.Errorf("%w: %q", ErrTopicTaken, cfg.Topic)
	}
	l.inboxes[cfg.Topic] = in
	return &Subscriber{cfg: cfg, last: -1, heard: -1, in: in, release: func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.inboxes[in.topic] == in {
			delete(l.inboxes, in.topic)
		}
	}}, nil
}

// runInbox is Run for a Listener's Subscriber: it handles the messages
// of its inbox until ctx ends, then frees the topic. Each time the inbox
// is empty, it catches up with what the Listener dropped.
func (s *Subscriber) runInbox(ctx context.Context, fn func(seq int64, b *Batch)) error {
	defer s.release()
	for {
		select {
		case frames := <-s.in.ch:
			s.in.queued.Add(-int64(len(frames[0]) + len(frames[1]) + len(frames[2])))
			s.onMessage(ctx, frames, fn)
		case <-s.in.kick:
		case <-ctx.Done():
			return ctx.Err()
		}
		if len(s.in.ch) == 0 {
			s.catchUp(ctx, fn)
		}
	}
}

// catchUp replays the messages the Listener dropped whose gap no message
// handled since has shown: a worker's last batches before it goes quiet
// would otherwise wait for its next one. A message dropped before others
// that are still queued is replayed as well; those, heard after, are
// duplicates and skipped. What the replay does not bring is reported lost
// when the next batch is heard, as for any gap.
func (s *Subscriber) catchUp(ctx context.Context, fn func(seq int64, b *Batch)) {
	if seq := s.in.dropped.Swap(-1); seq > s.last {
		s.replay(ctx, seq+1, fn)
	}
}

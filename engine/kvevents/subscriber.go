package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvstrata/kvstrata/engine/kvevents/internal/zmtpguard"
)

// SubscriberConfig configures a Subscriber. Its zero value is not usable:
// Endpoint is required.
type SubscriberConfig struct {
	// Endpoint is the worker's PUB socket, e.g. "tcp://127.0.0.1:5557".
	// Required.
	Endpoint string
	// ReplayEndpoint is the worker's replay ROUTER socket. Empty: no
	// replay, every gap is reported lost at once.
	ReplayEndpoint string
	// Topic is the prefix of the topics subscribed to. The default, "",
	// subscribes to every message.
	Topic string
	// ReplayTimeout bounds each wait for the replay socket: for a dial and
	// for each message of an answer. Past it the replay is given up, what
	// it did not bring is reported lost, and live delivery goes on. The
	// default is 5 s.
	ReplayTimeout time.Duration
	// RetryInterval is the wait between attempts to connect to Endpoint
	// (at the start and after the connection is lost). The default is
	// 250 ms.
	RetryInterval time.Duration
	// MaxMessage bounds each message the Subscriber receives, in bytes
	// (the sum of its frames): a publisher that announces a larger one
	// has its connection closed, is counted in Stats' BadPeers, and is
	// dialed again after RetryInterval. The default is 16 MiB, far above
	// an engine step's batch of events.
	MaxMessage int64

	// OnReset, if not nil, is told that the publisher restarted: its
	// sequence numbers went back. Every block it reported before is gone;
	// the batches delivered after it are the new publisher's.
	OnReset func()
	// OnLost, if not nil, is told that the batches numbered from first up
	// to (not including) end were neither heard nor recovered by replay:
	// the blocks they reported are unknown.
	OnLost func(first, end int64)
}

// EnsureDefaults fills zero fields with their documented defaults.
func (c *SubscriberConfig) EnsureDefaults() {
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = 5 * time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = 250 * time.Millisecond
	}
	if c.MaxMessage == 0 {
		c.MaxMessage = 16 << 20
	}
}

// Validate reports what is wrong with c.
func (c *SubscriberConfig) Validate() error { return c.validate(false) }

// validate is Validate; bound is for a Listener's subscriber, which has
// no Endpoint of its own.
func (c *SubscriberConfig) validate(bound bool) error {
	var errs []error
	if c.Endpoint == "" && !bound {
		errs = append(errs, errors.New("kvevents: Endpoint: required"))
	}
	if c.Endpoint != "" {
		if err := checkEndpoint(c.Endpoint); err != nil {
			errs = append(errs, fmt.Errorf("kvevents: Endpoint: %w", err))
		}
	}
	if c.ReplayEndpoint != "" {
		if err := checkEndpoint(c.ReplayEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("kvevents: ReplayEndpoint: %w", err))
		}
	}
	if c.ReplayTimeout < 0 {
		errs = append(errs, fmt.Errorf("kvevents: ReplayTimeout: %v is negative", c.ReplayTimeout))
	}
	if c.RetryInterval < 0 {
		errs = append(errs, fmt.Errorf("kvevents: RetryInterval: %v is negative", c.RetryInterval))
	}
	if c.MaxMessage < 0 {
		errs = append(errs, fmt.Errorf("kvevents: MaxMessage: %d is negative", c.MaxMessage))
	}
	return errors.Join(errs...)
}

// checkEndpoint reports what is wrong with a ZMQ endpoint, so that Run,
// which dials until it is told to stop, is not given one no dial mends.
func checkEndpoint(ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	switch {
	case !ok:
		return fmt.Errorf("%q is not transport://address", ep)
	case !slices.Contains(zmq4.Transports(), scheme):
		return fmt.Errorf("%q: unknown transport %q", ep, scheme)
	case scheme == "tcp":
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%q: %w", ep, err)
		}
	}
	return nil
}

// SubscriberStats counts what a Subscriber heard.
type SubscriberStats struct {
	Delivered  uint64 // batches handed to the callback
	Replayed   uint64 // of those, batches that came by replay
	Duplicates uint64 // batches heard again after a replay brought them, skipped
	Malformed  uint64 // messages that were not event batches, skipped
	Lost       uint64 // batches neither heard nor recovered
	Resets     uint64 // publisher restarts seen
	Replays    uint64 // replay requests made
	BadPeers   uint64 // connections closed for breaking ZMTP, MaxMessage or the handshake timeout
}

// Subscriber follows one worker's KV events: a SUB socket on its PUB
// endpoint, and a replay socket to fill gaps. Run delivers each batch
// once, in sequence order, to its callback; it recovers a gap (a sequence
// number beyond the next one) by asking the replay socket for what is
// missing, delivers that first, and reports what it could not recover
// (OnLost). A sequence number that goes back is a restarted publisher
// (OnReset); vLLM's messages carry no epoch, so a restart whose numbers
// have already passed the old ones is seen as a gap, not a reset.
// Messages that are not event batches are counted and skipped.
//
// Both sockets dial through zmtpguard: a publisher (or replay socket)
// that sends anything but ZMTP, or announces a message over MaxMessage,
// has its connection closed and counted (BadPeers), as a lost connection.
//
// A batch heard before any other is preceded by a replay from sequence 0,
// so that a subscriber that joins late learns what the worker's pool
// holds, as far as the replay buffer reaches back.
//
// A Listener's Subscriber (Listener.Subscriber) dials no PUB socket: it
// hears its topic's messages on the Listener's socket, and only its
// replay socket dials.
//
// Stats may be called from any goroutine; Run once at a time.
type Subscriber struct {
	cfg SubscriberConfig

	// The sequence state, owned by Run. last is the last sequence number
	// delivered (-1: none); heard the last one heard live. A number above
	// heard but not above last was delivered by replay: a duplicate.
	last, heard int64

	delivered, replayed, duplicates, malformed, lost, resets, replays, badPeers atomic.Uint64

	// A Listener's subscriber hears its topic's inbox, not a connection
	// of its own, and frees the topic (release) when Run returns.
	in      *inbox
	release func()
}

// NewSubscriber checks cfg and returns a Subscriber that Run starts.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := zmtpguard.Register(); err != nil {
		return nil, err
	}
	return &Subscriber{cfg: cfg, last: -1, heard: -1}, nil
}

// Subscribe runs a Subscriber of cfg until ctx ends.
func Subscribe(ctx context.Context, cfg SubscriberConfig, fn func(seq int64, b *Batch)) error {
	s, err := NewSubscriber(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx, fn)
}

// Run subscribes and calls fn (and the config's OnReset and OnLost) from
// its own goroutine, one call at a time, until ctx ends; then it returns
// ctx's error. It waits for the endpoint to come up, and dials again,
// after RetryInterval, when the connection is lost or refused. fn owns
// the batch.
func (s *Subscriber) Run(ctx context.Context, fn func(seq int64, b *Batch)) error {
	if s.in != nil {
		return s.runInbox(ctx, fn)
	}
	for {
		if err := s.follow(ctx, fn); err != nil {
			return err
		}
		select {
		case <-time.After(s.cfg.RetryInterval):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// follow dials the publisher on a new socket and handles what it hears
// until the connection is lost, the dial fails or ctx ends. Its error is
// one that dialing again would not mend.
//
// A socket per connection, not zmq4's automatic reconnection: that dials
// again once, from the lost connection's goroutine, and gives up for
// good if the handshake fails.
func (s *Subscriber) follow(ctx context.Context, fn func(seq int64, b *Batch)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(s.socketContext(ctx), zmq4.WithLogger(zmqLog),
		zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(s.cfg.RetryInterval))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("kvevents: subscribe %q: %w", s.cfg.Topic, err)
	}
	if sub.Dial(zmtpguard.Endpoint(s.cfg.Endpoint)) != nil {
		return nil // refused, or ctx ended: Run waits, and dials again or returns
	}
	for {
		msg, err := sub.Recv()
		if err != nil || ctx.Err() != nil {
			return nil
		}
		s.onMessage(ctx, msg.Frames, fn)
	}
}

// socketContext is ctx with the limits of the Subscriber's sockets.
func (s *Subscriber) socketContext(ctx context.Context) context.Context {
	return zmtpguard.WithLimits(ctx, zmtpguard.Limits{
		MaxMessage: s.cfg.MaxMessage, OnReject: func(error) { s.badPeers.Add(1) },
	})
}

// Stats returns the counters.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{
		Delivered:  s.delivered.Load(),
		Replayed:   s.replayed.Load(),
		Duplicates: s.duplicates.Load(),
		Malformed:  s.malformed.Load(),
		Lost:       s.lost.Load(),
		Resets:     s.resets.Load(),
		Replays:    s.replays.Load(),
		BadPeers:   s.badPeers.Load(),
	}
}

// onMessage handles one message heard live.
func (s *Subscriber) onMessage(ctx context.Context, frames [][]byte, fn func(int64, *Batch)) {
	_, seq, payload, err := ParseFrames(frames)
	if err != nil || seq < 0 {
		s.malformed.Add(1)
		return
	}
	b, err := Decode(payload)
	if err != nil {
		// Its number may be real, or garbage: leave the sequence alone. If
		// it was real, the next batch shows the gap and replay tries it.
		s.malformed.Add(1)
		return
	}
	switch {
	case seq <= s.heard:
		s.resets.Add(1)
		s.last, s.heard = -1, -1
		if s.cfg.OnReset != nil {
			s.cfg.OnReset()
		}
	case seq <= s.last:
		s.heard = seq
		s.duplicates.Add(1)
		return
	}
	s.heard = seq
	if seq > s.last+1 {
		s.replay(ctx, seq, fn)
	}
	s.deliver(seq, b, fn)
}

// deliver hands on batch seq, the one after the last delivered, or the
// first after a loss.
func (s *Subscriber) deliver(seq int64, b *Batch, fn func(int64, *Batch)) {
	if seq > s.last+1 {
		s.lose(s.last+1, seq)
	}
	s.last = seq
	s.delivered.Add(1)
	fn(seq, b)
}

func (s *Subscriber) lose(first, end int64) {
	s.lost.Add(uint64(end - first))
	if s.cfg.OnLost != nil {
		s.cfg.OnLost(first, end)
	}
}

// replay asks the replay socket for the batches after the last delivered
// and delivers those before end, in order. An answer cut off part way (the
// publisher closes a replay client that is slow to read, or the
// connection drops) is asked for again from the first batch it did not
// bring, for as long as each answer brings some. What it cannot get is
// left for deliver to report lost.
func (s *Subscriber) replay(ctx context.Context, end int64, fn func(int64, *Batch)) {
	if s.cfg.ReplayEndpoint == "" {
		return
	}
	for s.last+1 < end {
		before := s.last
		if !s.replayOnce(ctx, end, fn) || s.last == before {
			return
		}
	}
}

// replayOnce makes one replay request for the batches after the last
// delivered and delivers those before end. It reports whether the answer
// was cut off: its connection closed before the answer's end.
func (s *Subscriber) replayOnce(ctx context.Context, end int64, fn func(int64, *Batch)) (cut bool) {
	s.replays.Add(1)
	replies := make(chan [][]byte)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.fetch(rctx, s.last+1, replies)
	t := time.NewTimer(s.cfg.ReplayTimeout)
	defer t.Stop()
	for {
		var frames [][]byte
		select {
		case frames = <-replies:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
		if frames == nil {
			return true
		}
		t.Reset(s.cfg.ReplayTimeout)
		seq, payload, last, err := ParseReplayReply(frames)
		if err != nil || last || seq >= end {
			if err != nil {
				s.malformed.Add(1)
			}
			return false
		}
		if seq <= s.last {
			continue
		}
		b, err := Decode(payload)
		if err != nil {
			s.malformed.Add(1)
			continue // reported lost with the next batch delivered
		}
		s.replayed.Add(1)
		s.deliver(seq, b, fn)
	}
}

// fetch sends a replay request for start on and passes each reply's frames
// (without the empty delimiter) to out, until the answer ends, a reply is
// not what the protocol says, or ctx ends; then it closes out.
func (s *Subscriber) fetch(ctx context.Context, start int64, out chan<- [][]byte) {
	defer close(out)
	dealer := zmq4.NewDealer(s.socketContext(ctx), zmq4.WithLogger(zmqLog), zmq4.WithDialerRetry(s.cfg.RetryInterval),
		zmq4.WithDialerTimeout(s.cfg.ReplayTimeout), zmq4.WithDialerMaxRetries(0))
	defer dealer.Close()
	if dealer.Dial(zmtpguard.Endpoint(s.cfg.ReplayEndpoint)) != nil {
		return
	}
	req := append([][]byte{{}}, ReplayRequest(start)...)
	if dealer.SendMulti(zmq4.NewMsgFrom(req...)) != nil {
		return
	}
	for {
		msg, err := dealer.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) < 1 || len(msg.Frames[0]) != 0 {
			msg.Frames = [][]byte{} // not a reply: ParseReplayReply refuses it
		} else {
			msg.Frames = msg.Frames[1:]
		}
		select {
		case out <- msg.Frames:
		case <-ctx.Done():
			return
		}
		if seq, _, end, err := ParseReplayReply(msg.Frames); err != nil || end || seq < 0 {
			return
		}
	}
}

package kvevents

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/engine/pool"
)

// ErrDrainTimeout: PoolSink.Close gave up waiting for queued batches to be
// sent. They stay in the replay buffer.
var ErrDrainTimeout = errors.New("kvevents: sink closed before its queue was sent")

// HashForm is how a PoolSink writes the pool's 64-bit block hashes.
type HashForm int

const (
	// HashInts writes each hash as a msgpack unsigned integer, as vLLM did
	// before it hashed with sha256. It is the default: every vLLM-event
	// consumer reads it — Dynamo's ZMQ relay accepts only integers (signed
	// or unsigned 64-bit), llm-d's indexer reads integers and bytes.
	HashInts HashForm = iota
	// HashBytes writes each hash as 8 bytes, big-endian, as newer vLLM
	// writes its sha256 digests as byte strings; a consumer that keeps the
	// last 8 bytes of a byte-string hash (llm-d) reads the same uint64.
	HashBytes
)

// SinkConfig configures a PoolSink. Its zero value is usable.
type SinkConfig struct {
	// Medium names where the blocks live. The default is MediumGPU, as
	// vLLM reports the blocks of its device pool.
	Medium string
	// DataParallelRank is every batch's data_parallel_rank. The default is
	// 0. It is always written, because Dynamo reads a batch as the triple
	// [ts, events, data_parallel_rank].
	DataParallelRank int64
	// Hashes is how block hashes are written. The default is HashInts.
	Hashes HashForm
	// QueueBatches is how many flushed batches may wait to be sent. When
	// the queue is full the oldest waiting batch is not sent (it is still
	// numbered and kept for replay, and counted as dropped): subscribers
	// see the gap with the next batch and replay it. The default is 1024.
	QueueBatches int
	// DrainTimeout bounds how long Close waits for the queue to be sent.
	// The default is 5 s.
	DrainTimeout time.Duration
}

// EnsureDefaults fills zero fields with their documented defaults.
func (c *SinkConfig) EnsureDefaults() {
	if c.Medium == "" {
		c.Medium = MediumGPU
	}
	if c.QueueBatches == 0 {
		c.QueueBatches = 1024
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5 * time.Second
	}
}

// Validate reports what is wrong with c.
func (c *SinkConfig) Validate() error {
	var errs []error
	if c.Hashes != HashInts && c.Hashes != HashBytes {
		errs = append(errs, fmt.Errorf("kvevents: Hashes: unknown form %d", c.Hashes))
	}
	if c.QueueBatches < 0 {
		errs = append(errs, fmt.Errorf("kvevents: QueueBatches: %d is negative", c.QueueBatches))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("kvevents: DrainTimeout: %v is negative", c.DrainTimeout))
	}
	return errors.Join(errs...)
}

// SinkStats counts a PoolSink's batches since NewPoolSink.
type SinkStats struct {
	Events  uint64 // pool events received
	Batches uint64 // batches flushed, numbered and kept for replay
	Sent    uint64 // batches sent on the PUB socket
	Dropped uint64 // batches not sent because the queue was full
	Failed  uint64 // batches whose encoding or send failed
}

// PoolSink publishes a block pool's events as vLLM's KV events: it is the
// engine loop's EventSink (engine/sched). Event adds a pool event to the
// batch being built; Flush encodes that batch, gives it the publisher's
// next sequence number, keeps it in the replay buffer and queues it; one
// goroutine sends the queue on the PUB socket, so neither call waits for
// the socket. The pool's namespace is not written (vLLM's events have no
// such field): a worker's pool holds one model's blocks.
//
// Event, Flush, Stats and Close are safe for concurrent use; events reach
// batches in the order of the calls. A Publisher that feeds a PoolSink
// should publish nothing else, or its batches may go out of order (a
// subscriber then replays what it sees missing).
type PoolSink struct {
	cfg   SinkConfig
	pub   *Publisher
	queue chan message
	done  chan struct{} // closed when the sending goroutine ends
	quit  chan struct{} // closed when Close gives up draining

	mu     sync.Mutex
	batch  []Event
	closed bool

	events, batches, sent, dropped, failed atomic.Uint64
}

// NewPoolSink returns a sink that publishes through pub (which the caller
// keeps and closes after the sink).
func NewPoolSink(pub *Publisher, cfg SinkConfig) (*PoolSink, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &PoolSink{
		cfg:   cfg,
		pub:   pub,
		queue: make(chan message, cfg.QueueBatches),
		done:  make(chan struct{}),
		quit:  make(chan struct{}),
	}
	go s.run()
	return s, nil
}

// Event adds e to the batch being built. It owns e's slices.
func (s *PoolSink) Event(e pool.Event) {
	ev := s.convert(e)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || ev == nil {
		return
	}
	s.events.Add(1)
	s.batch = append(s.batch, ev)
}

// Flush ends the batch being built, if it has events, and queues it.
func (s *PoolSink) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.batch) == 0 {
		return
	}
	rank := s.cfg.DataParallelRank
	b := &Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: s.batch, DataParallelRank: &rank}
	s.batch = nil
	payload, err := Encode(b, s.pub.cfg.Encoding)
	if err != nil { // the sink builds only events Encode knows
		s.failed.Add(1)
		return
	}
	m := s.pub.record(payload)
	s.batches.Add(1)
	select {
	case s.queue <- m:
		return
	default:
	}
	// Full: drop the oldest waiting batch (unless the sender just took
	// it), so that the newest goes out and subscribers see the gap now.
	select {
	case <-s.queue:
		s.dropped.Add(1)
	default:
	}
	s.queue <- m // only Flush adds, under s.mu: there is room now
}

// run sends queued batches until the queue is closed and empty, or Close
// gives up.
func (s *PoolSink) run() {
	defer close(s.done)
	for m := range s.queue {
		select {
		case <-s.quit:
			return
		default:
		}
		s.pub.sendMu.Lock()
		err := s.pub.send(m)
		s.pub.sendMu.Unlock()
		if err != nil {
			s.failed.Add(1)
		} else {
			s.sent.Add(1)
		}
	}
}

// Close stops taking events, drops a batch not flushed, and waits up to
// DrainTimeout for the queue to be sent; past it, it returns
// ErrDrainTimeout. It does not close the Publisher.
func (s *PoolSink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed, s.batch = true, nil
	close(s.queue)
	s.mu.Unlock()
	t := time.NewTimer(s.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-s.done:
		return nil
	case <-t.C:
		close(s.quit)
		return fmt.Errorf("%w: %d batches waiting after %v", ErrDrainTimeout, len(s.queue), s.cfg.DrainTimeout)
	}
}

// Stats returns the sink's counters.
func (s *PoolSink) Stats() SinkStats {
	return SinkStats{
		Events:  s.events.Load(),
		Batches: s.batches.Load(),
		Sent:    s.sent.Load(),
		Dropped: s.dropped.Load(),
		Failed:  s.failed.Load(),
	}
}

// convert is e as a vLLM event; nil for a kind it does not know.
func (s *PoolSink) convert(e pool.Event) Event { return PoolEvent(e, s.cfg.Medium, s.cfg.Hashes) }

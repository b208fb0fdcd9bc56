package raftstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ProposeFunc proposes the data of one raft entry and returns once the
// entry is committed, or with why it may not have been. The wiring
// decides what it does: raft.Apply on the leader (RaftPropose), or a
// forward to the leader over gRPC. It must honour ctx, must not change
// data, and should call Submitted(ctx) as soon as the entry's place in
// the log is fixed, which lets the Batcher pipeline proposals.
type ProposeFunc func(ctx context.Context, data []byte) error

// BatcherConfig configures a Batcher. Zero fields take their defaults.
type BatcherConfig struct {
	// Propose commits one entry. Required.
	Propose ProposeFunc
	// MaxEvents is the number of events at which a batch is proposed at
	// once. 4096 events make an entry of about 36–160 KiB; on a 3-node
	// loopback cluster 4096 roughly doubles the events/s of 1024. The
	// default is 4096, the most is 65536.
	MaxEvents int
	// MaxDelay is how long a batch that is not full waits for more
	// events after its first. It bounds the added staleness of the
	// directory when a node is quiet. A batch due while proposals are
	// outstanding (MaxInFlight of them, or one not submitted yet) waits
	// for one and takes more events meanwhile. The default is 2ms.
	MaxDelay time.Duration
	// MinInterval is the least time between the sealing of one batch and
	// that of the next partial one: under a steady stream of events the
	// batcher proposes at most one partial batch every MinInterval, however
	// short MaxDelay is, while a quiet node's first event still goes after
	// MaxDelay. Each entry costs the leader a sync of its log and every
	// replica an apply, whatever it holds: a node whose tiers change
	// thousands of times a second (every hit on a lower tier is promoted,
	// and every promotion evicts) proposed one entry every MaxDelay and
	// spent 5–10 % of its CPU on them, which this bounds, at the cost of
	// up to MinInterval more staleness under such a load. Full batches,
	// and Flush, do not wait for it. The default is 10ms.
	MinInterval time.Duration
	// QueueSize is the number of events the batcher holds, waiting or in
	// flight, before Add drops events. Events are held encoded, a few
	// bytes each. The default is 262144; it must be at least MaxEvents.
	QueueSize int
	// MaxInFlight is the number of proposals outstanding at once. More
	// hide more of a commit's latency. The default is 4.
	MaxInFlight int
	// ProposeTimeout bounds one proposal. The default is 10s.
	ProposeTimeout time.Duration
	// RetryBackoff is the wait before proposing again after a failure; it
	// doubles with each failure in a row up to MaxRetryBackoff. The
	// defaults are 20ms and 2s.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// Logger receives a line when proposals start failing and when they
	// recover. The default is slog.Default().
	Logger *slog.Logger
}

// Defaults of BatcherConfig.
const (
	DefaultMaxEvents       = 4096
	DefaultMaxDelay        = 2 * time.Millisecond
	DefaultMinInterval     = 10 * time.Millisecond
	DefaultQueueSize       = 256 << 10
	DefaultMaxInFlight     = 4
	DefaultProposeTimeout  = 10 * time.Second
	DefaultRetryBackoff    = 20 * time.Millisecond
	DefaultMaxRetryBackoff = 2 * time.Second
	maxMaxEvents           = 1 << 16
)

// EnsureDefaults sets every zero field of c to its default. It leaves
// bad values for Validate to report.
func (c *BatcherConfig) EnsureDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.MaxEvents, DefaultMaxEvents)
	def(&c.QueueSize, DefaultQueueSize)
	def(&c.MaxInFlight, DefaultMaxInFlight)
	defDur(&c.MaxDelay, DefaultMaxDelay)
	defDur(&c.MinInterval, DefaultMinInterval)
	defDur(&c.ProposeTimeout, DefaultProposeTimeout)
	defDur(&c.RetryBackoff, DefaultRetryBackoff)
	defDur(&c.MaxRetryBackoff, DefaultMaxRetryBackoff)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate returns an error that names every bad field of c, or nil. Call
// it after EnsureDefaults: it reports the zero value of a field that has a
// default as out of range.
func (c *BatcherConfig) Validate() error {
	var errs []error
	if c.Propose == nil {
		errs = append(errs, errors.New("Propose is nil"))
	}
	for _, f := range []struct {
		name string
		bad  bool
	}{
		{"MaxEvents", c.MaxEvents <= 0 || c.MaxEvents > maxMaxEvents},
		{"MaxDelay", c.MaxDelay <= 0},
		{"MinInterval", c.MinInterval <= 0},
		{"QueueSize", c.QueueSize <= 0},
		{"MaxInFlight", c.MaxInFlight <= 0},
		{"ProposeTimeout", c.ProposeTimeout <= 0},
		{"RetryBackoff", c.RetryBackoff <= 0},
		{"MaxRetryBackoff", c.MaxRetryBackoff <= 0},
	} {
		if f.bad {
			errs = append(errs, fmt.Errorf("%s is out of range", f.name))
		}
	}
	if c.Logger == nil {
		errs = append(errs, errors.New("Logger is nil"))
	}
	if c.QueueSize > 0 && c.QueueSize < c.MaxEvents {
		errs = append(errs, fmt.Errorf("QueueSize %d is below MaxEvents %d", c.QueueSize, c.MaxEvents))
	}
	return errors.Join(errs...)
}

// BatcherStats counts what a Batcher did since it was made.
type BatcherStats struct {
	Added     uint64 // events taken by Add
	Dropped   uint64 // events Add refused: queue full, or closed
	Committed uint64 // events in committed batches
	Batches   uint64 // batches committed
	Proposals uint64 // calls of Propose, retries included
	Failures  uint64 // calls of Propose that failed
	Resent    uint64 // batches proposed again after a failure
	Queued    int    // events held now: waiting, or in flight
}

// Batcher collects a node's directory events and proposes them in
// batches, one raft entry each.
//
// A batch is proposed when it holds MaxEvents events, or MaxDelay after its
// first event and MinInterval after the last batch once a proposal can go
// out: while MaxInFlight proposals are outstanding, or the last one is not
// submitted yet, it keeps taking events (group commit). Up to MaxInFlight
// proposals are outstanding at once, and submitted in the order the
// batches were made (see Submitted).
// When one fails, the batcher waits for the others to return, backs off,
// and proposes again from the failed batch on, every later batch included
// even if it was committed: the replicas then end with each block's last
// event applied last, whatever was committed twice or out of order
// meanwhile. Applying an event twice does no harm. Failures are retried
// until they succeed or the batcher closes; a batch that can never be
// committed stalls the batcher, whose queue then fills and drops events
// (Stats tells).
//
// Add never blocks. When the queue is full (the cluster has no leader, or
// commits more slowly than the node changes), Add drops the event and
// counts it. The directory is a cache of what the nodes hold: a dropped
// stored event is a block the directory does not know of, which costs a
// cache miss; a dropped removed event is a stale location, which costs
// one failed fetch, after which the reader falls back (and should report
// it, so that a removed event corrects the directory), or is corrected by
// the block's next event.
//
// All methods are safe for concurrent use.
type Batcher struct {
	cfg     BatcherConfig
	ctx     context.Context // cancelled by Close, to stop proposals
	cancel  context.CancelFunc
	wake    chan struct{}
	retry   chan struct{} // RetryNow's
	results chan proposal
	quit    chan struct{}
	wg      sync.WaitGroup

	mu       sync.Mutex
	cur      EventBatch
	curSince time.Time     // when cur got its first event
	sealed   time.Time     // when the last batch was sealed
	window   []*batch      // sealed batches not committed yet, by seq
	base     uint64        // seq of window[0]; of the next batch when empty
	nextSeq  uint64        // seq of the next batch sealed
	sendSeq  uint64        // seq of the next batch to propose
	advanced chan struct{} // closed, and replaced, when base advances
	closed   bool
	stats    BatcherStats
	// committed is the highest raft index a proposal was committed at.
	committed uint64
	// The state of sending, which only run changes.
	inflight int // Propose calls outstanding, stale ones included
	// lastSubmitted is closed once the latest proposal is submitted.
	lastSubmitted chan struct{}
	recovering    bool   // a proposal failed: send nothing until resumed
	goBack        uint64 // the seq to propose again from on resuming
	failures      int    // recoveries since the last success
	backoffStep   int    // doublings of the next backoff; RetryNow resets it
}

// batch is one sealed batch.
type batch struct {
	seq     uint64
	data    []byte
	events  int
	attempt uint64 // of its latest proposal; results of earlier ones are stale
	done    bool   // its latest proposal succeeded
}

// proposal is the result of one call of Propose.
type proposal struct {
	seq, attempt uint64
	err          error
}

// NewBatcher starts a batcher. Close stops it.
func NewBatcher(cfg BatcherConfig) (*Batcher, error) {
	c := cfg
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("raftstore: batcher config: %w", err)
	}
	b := &Batcher{
		cfg:      c,
		wake:     make(chan struct{}, 1),
		retry:    make(chan struct{}, 1),
		results:  make(chan proposal, c.MaxInFlight),
		quit:     make(chan struct{}),
		base:     1,
		nextSeq:  1,
		sendSeq:  1,
		advanced: make(chan struct{}),
	}
	b.lastSubmitted = make(chan struct{})
	close(b.lastSubmitted)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.wg.Add(1)
	go b.run()
	return b, nil
}

// Add queues ev and reports whether it was taken: false when the queue is
// full or the batcher closed, and the event dropped. It panics on an event
// of an unknown kind.
func (b *Batcher) Add(ev Event) bool {
	if ev.Kind < EventStored || ev.Kind > EventNodeDropped {
		panic(fmt.Sprintf("raftstore: Batcher.Add: unknown event kind %d", ev.Kind))
	}
	b.mu.Lock()
	if b.closed || b.stats.Queued >= b.cfg.QueueSize {
		b.stats.Dropped++
		b.mu.Unlock()
		return false
	}
	b.stats.Added++
	b.stats.Queued++
	b.cur.Append(ev)
	wake := false
	if b.cur.Len() == 1 {
		b.curSince = time.Now()
		wake = true
	}
	if b.cur.Len() >= b.cfg.MaxEvents {
		b.sealLocked()
		wake = true
	}
	b.mu.Unlock()
	if wake {
		b.kick()
	}
	return true
}

// Flush proposes what Add took before the call and waits until it is all
// committed, ctx is done, or the batcher closes.
func (b *Batcher) Flush(ctx context.Context) error {
	b.mu.Lock()
	if b.cur.Len() > 0 {
		b.sealLocked()
		b.kick()
	}
	target := b.nextSeq
	for b.base < target {
		if b.closed {
			b.mu.Unlock()
			return fmt.Errorf("raftstore: batcher flush: %w", ErrClosed)
		}
		ch := b.advanced
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("raftstore: batcher flush: %w", ctx.Err())
		case <-b.quit:
		}
		b.mu.Lock()
	}
	b.mu.Unlock()
	return nil
}

// committedAt records that a proposal was committed at raft index i.
func (b *Batcher) committedAt(i uint64) {
	b.mu.Lock()
	b.committed = max(b.committed, i)
	b.mu.Unlock()
}

// CommittedIndex returns the highest raft index at which one of the
// batcher's proposals is known to have been committed (0 when its
// ProposeFunc does not say, see Committed). After Flush, a replica that
// has applied this far lists every event added before the Flush.
func (b *Batcher) CommittedIndex() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.committed
}

// Close stops the batcher: proposals in flight are cancelled and events
// not committed yet are discarded (Flush first to keep them). Later Adds
// drop their events.
func (b *Batcher) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("raftstore: batcher close: %w", ErrClosed)
	}
	b.closed = true
	b.mu.Unlock()
	close(b.quit)
	b.cancel()
	b.wg.Wait()
	return nil
}

// Stats returns the batcher's counters.
func (b *Batcher) Stats() BatcherStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// RetryNow ends a wait before proposing again after a failure, and starts
// the backoff over: the cause of the failure is gone (the node learned of
// a new leader). It does nothing while no proposal failed.
func (b *Batcher) RetryNow() {
	select {
	case b.retry <- struct{}{}:
	default:
	}
}

// kick wakes run, without blocking.
func (b *Batcher) kick() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// sealLocked turns the open batch into the next batch to propose. The
// caller holds b.mu.
func (b *Batcher) sealLocked() {
	b.window = append(b.window, &batch{seq: b.nextSeq, data: b.cur.Encode(), events: b.cur.Len()})
	b.nextSeq++
	b.cur.Reset()
	b.curSince = time.Time{}
	b.sealed = time.Now()
}

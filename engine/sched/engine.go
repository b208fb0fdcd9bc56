package sched

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// ErrTransfer is the final Output's Err of a DoRemoteDecode request whose
// blocks could not be stored in kvstrata (no Connector, or Store failed).
var ErrTransfer = errors.New("sched: kv transfer failed")

// Engine is a worker's engine loop. One goroutine owns the block pool, the
// KV arena and the model; Generate, Stats and Close are safe for concurrent
// use.
type Engine struct {
	cfg    Config
	layout model.Layout
	ns     index.Namespace
	nsID   index.NamespaceID
	bt     int
	m      *metrics
	log    *slog.Logger

	// Owned by the loop.
	pool *pool.Pool
	// arena is the worker's KV memory, BlockBytes per pool block;
	// layers[id] are block id's layers within it.
	arena    []byte
	layers   [][][]byte
	waiting  []*seq            // FCFS; preempted requests go back to the front
	running  []*seq            // in the order they joined the batch
	inflight map[*seq]struct{} // onboarding or storing
	events   bool              // the pool made events since the last Flush
	counters counters

	ctx    context.Context // cancelled by Close: interrupts steps and cache calls
	cancel context.CancelFunc
	io     sync.WaitGroup // onboarding and store goroutines
	done   chan struct{}  // closed when the loop has ended
	// driven: the caller runs the loop one Step at a time (NewDriven).
	driven bool

	mu     sync.Mutex
	closed bool
	inbox  inbox
	// nWaiting counts queued requests, those Generate added and the loop
	// has not admitted yet included: MaxWaiting bounds it.
	nWaiting int
	wake     chan struct{}
}

// inbox is what other goroutines hand the loop, under Engine.mu.
type inbox struct {
	requests  []*seq
	cancelled []*seq
	onboarded []onboardResult
	stored    []storeResult
	stats     []chan Stats
}

// New starts an engine's loop; Close stops it.
func New(cfg Config) (*Engine, error) {
	e, err := build(cfg)
	if err != nil {
		return nil, err
	}
	go e.run()
	return e, nil
}

// build builds an engine whose loop is not started.
func build(cfg Config) (*Engine, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := cfg.Model.Layout()
	e := &Engine{
		cfg:      cfg,
		layout:   l,
		ns:       l.Namespace,
		nsID:     l.Namespace.ID(),
		bt:       l.Namespace.BlockTokens,
		log:      cfg.Logger,
		inflight: make(map[*seq]struct{}),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
	}
	var err error
	e.m, err = newMetrics(cfg.Registerer, cfg.ModelName)
	if err != nil {
		return nil, err
	}
	pcfg := pool.Config{Blocks: cfg.Blocks, BlockTokens: e.bt}
	if cfg.Events != nil {
		pcfg.Listener = func(ev pool.Event) { cfg.Events.Event(ev); e.events = true }
	}
	if e.pool, err = pool.New(pcfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	bb, lb := l.BlockBytes(), l.LayerBytes()
	e.arena = make([]byte, cfg.Blocks*bb)
	e.layers = make([][][]byte, cfg.Blocks)
	for id := range e.layers {
		ls := make([][]byte, l.Namespace.Layout.Layers)
		for i := range ls {
			off := id*bb + i*lb
			ls[i] = e.arena[off : off+lb : off+lb]
		}
		e.layers[id] = ls
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// block is block id's KV in the arena, all layers.
func (e *Engine) block(id pool.BlockID) []byte {
	bb := e.layout.BlockBytes()
	return e.arena[int(id)*bb : (int(id)+1)*bb : (int(id)+1)*bb]
}

// Generate checks req, queues it, and returns the channel its Outputs come
// on. The channel is never blocked on: Outputs the reader has not taken are
// merged into the next. The last Output has Finish set (FinishAbort with
// Err when the request failed or was cancelled) and the channel is closed
// after it. Cancelling ctx aborts the request and frees its blocks.
//
// Errors: ErrBadRequest (the message says which rule), ErrTooLong (it
// names the context length), ErrOverloaded (MaxWaiting requests are
// queued), ErrClosed, or ctx's error when ctx is already done.
func (e *Engine) Generate(ctx context.Context, req Request) (<-chan Output, error) {
	s, err := e.check(req)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.ctx = ctx
	s.out = make(chan Output, 1)
	s.arrived = e.cfg.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if e.nWaiting >= e.cfg.MaxWaiting {
		return nil, fmt.Errorf("%w: %d requests are waiting", ErrOverloaded, e.nWaiting)
	}
	e.nWaiting++
	e.inbox.requests = append(e.inbox.requests, s)
	s.stop = context.AfterFunc(ctx, func() { e.post(func(in *inbox) { in.cancelled = append(in.cancelled, s) }) })
	e.signal()
	return s.out, nil
}

// check validates req and returns the request's engine state.
func (e *Engine) check(req Request) (*seq, error) {
	switch {
	case len(req.Prompt) == 0:
		return nil, fmt.Errorf("%w: the prompt is empty", ErrBadRequest)
	case req.MaxTokens < 1:
		return nil, fmt.Errorf("%w: max tokens is %d, must be ≥ 1", ErrBadRequest, req.MaxTokens)
	case math.IsNaN(req.Sampling.Temperature) || req.Sampling.Temperature < 0 || math.IsInf(req.Sampling.Temperature, 0):
		return nil, fmt.Errorf("%w: temperature is %v, must be ≥ 0", ErrBadRequest, req.Sampling.Temperature)
	case len(req.Prompt)+req.MaxTokens > e.cfg.ContextLen:
		return nil, fmt.Errorf("%w: the prompt's %d tokens plus max tokens %d exceed the context length of %d tokens",
			ErrTooLong, len(req.Prompt), req.MaxTokens, e.cfg.ContextLen)
	}
	s := &seq{req: req, tokens: make([]uint32, len(req.Prompt), len(req.Prompt)+req.MaxTokens)}
	copy(s.tokens, req.Prompt)
	if t := req.Transfer; t != nil {
		if t.DoRemoteDecode && t.DoRemotePrefill {
			return nil, fmt.Errorf("%w: kv_transfer_params sets both do_remote_decode and do_remote_prefill", ErrBadRequest)
		}
		if t.DoRemotePrefill {
			hs, err := e.remoteBlocks(req.Prompt, t)
			if err != nil {
				return nil, err
			}
			s.remote = hs
		}
	}
	return s, nil
}

// post hands the loop something under e.mu and wakes it.
func (e *Engine) post(f func(*inbox)) {
	e.mu.Lock()
	f(&e.inbox)
	e.signal()
	e.mu.Unlock()
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Stats is a snapshot of the engine's state and counters, for tests and
// metrics.
type Stats struct {
	Running, Waiting, Onboarding, Storing int
	Pool                                  pool.Stats
	counters
}

// counters are the engine's totals since New.
type counters struct {
	Steps            uint64 // iterations that ran the model
	PromptTokens     uint64 // prompt tokens of prefilled requests
	GeneratedTokens  uint64
	Preemptions      uint64
	OnboardedTokens  uint64 // loaded from kvstrata into the pool
	RecomputedTokens uint64 // the cache had or was named for them but did not deliver
	CacheErrors      uint64 // Lookup, Load or Store calls that failed or timed out
	OffloadedBlocks  uint64 // handed to Connector.Offload
	StoredBlocks     uint64 // stored for remote decode
}

// Stats returns a snapshot taken by the loop between two steps (after
// Close, the last one).
func (e *Engine) Stats() Stats {
	if e.driven {
		return e.snapshot()
	}
	c := make(chan Stats, 1)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.done
		return e.snapshot()
	}
	e.inbox.stats = append(e.inbox.stats, c)
	e.signal()
	e.mu.Unlock()
	select {
	case st := <-c:
		return st
	case <-e.done:
		return e.snapshot()
	}
}

// snapshot is the loop's state; called by the loop, or once it has ended.
func (e *Engine) snapshot() Stats {
	st := Stats{Running: len(e.running), Waiting: len(e.waiting), Pool: e.pool.Stats(), counters: e.counters}
	for s := range e.inflight {
		if s.phase == phaseOnboarding {
			st.Onboarding++
		} else {
			st.Storing++
		}
	}
	return st
}

// Close stops the loop: every request in flight ends with FinishAbort and
// ErrClosed, and later calls to Generate fail with ErrClosed. It returns
// once the loop and its cache calls have ended.
func (e *Engine) Close() {
	if e.driven {
		e.closeDriven()
		return
	}
	e.mu.Lock()
	e.closed = true
	e.signal()
	e.mu.Unlock()
	e.cancel()
	<-e.done
}

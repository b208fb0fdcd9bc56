package frontend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/router/kvindex"
	"github.com/kvstrata/kvstrata/router/policy"
)

// Errors a request may fail with; each wraps sched.ErrOverloaded, which
// the OpenAI API answers 503 with Retry-After.
var (
	// ErrQueueFull: every worker is busy and the wait queue is full.
	ErrQueueFull = fmt.Errorf("frontend: every worker is busy and the wait queue is full: %w", sched.ErrOverloaded)
	// ErrQueueTimeout: the request waited QueueWait for a worker.
	ErrQueueTimeout = fmt.Errorf("frontend: no worker became free in time: %w", sched.ErrOverloaded)
	// ErrNoWorkers: no worker is healthy.
	ErrNoWorkers = fmt.Errorf("frontend: no healthy worker: %w", sched.ErrOverloaded)
	// ErrMigrations: the request's workers failed more often than
	// MaxMigrations allows.
	ErrMigrations = errors.New("frontend: too many worker failures for one request")
)

// Router routes generation requests to workers: it is the frontend's
// openai.Engine.
type Router struct {
	cfg    Config
	ns     index.NamespaceID
	kv     *kvindex.Index
	choose *policy.Router
	cache  *client.Client
	http   *http.Client
	m      *metrics

	set    atomic.Pointer[workerSet] // the workers (workers.go)
	setMu  sync.Mutex                // serializes changes of set
	nextID uint32                    // the last kvindex.WorkerID given
	// retired says when each removed worker still in set's byName left.
	retired map[string]time.Time
	events  *kvevents.Listener // bind mode's socket; nil without one

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	waiting int
	freed   chan struct{} // closed and replaced whenever a sequence ends
}

// New returns a Router of cfg, defaults applied, and starts following
// each worker's KV events and health. Close stops it.
func New(cfg Config) (*Router, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	kv, err := kvindex.New(nil)
	if err != nil {
		return nil, err
	}
	choose, err := policy.New(cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	r := &Router{
		cfg: cfg, ns: cfg.Namespace.ID(), kv: kv, choose: choose, m: newMetrics(cfg.Registerer),
		retired: map[string]time.Time{}, freed: make(chan struct{}),
		http: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		}},
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if cfg.Cache != "" {
		if r.cache, err = client.Dial(r.ctx, cfg.Cache, client.Options{}); err != nil {
			r.cancel()
			return nil, fmt.Errorf("frontend: cache %s: %w", cfg.Cache, err)
		}
	}
	if err := r.listenEvents(); err != nil {
		r.Close()
		return nil, err
	}
	for _, spec := range cfg.Workers {
		if err := r.addWorker(spec, true); err != nil {
			r.Close()
			return nil, err
		}
	}
	if cfg.Discover {
		r.wg.Go(r.discover)
	}
	return r, nil
}

// Close stops following the workers and closes the cache client. Requests
// in flight are the caller's to end (their contexts).
func (r *Router) Close() error {
	r.cancel()
	r.wg.Wait()
	r.closeEvents()
	r.http.CloseIdleConnections()
	if r.cache != nil {
		return r.cache.Close()
	}
	return nil
}

// Index is the Router's KV index (its Stats, say).
func (r *Router) Index() *kvindex.Index { return r.kv }

// Healthy reports whether the worker of url is a candidate now.
func (r *Router) Healthy(url string) bool {
	w, ok := r.workerSet().byName[url]
	return ok && w.healthy.Load()
}

// Ready is nil while some worker that serves whole requests (a decode
// worker, when disaggregated) is a candidate, else ErrNoWorkers: what the
// frontend's /health says.
func (r *Router) Ready() error {
	for _, w := range r.workerSet().serving.workers {
		if w.healthy.Load() {
			return nil
		}
	}
	return ErrNoWorkers
}

// Load is the load the Router tracks on the worker of url.
func (r *Router) Load(url string) policy.Load { return r.choose.Load(url) }

// Generate routes r to a worker, streams its tokens back, and moves it to
// another worker, prompt plus the tokens produced, if its worker fails.
// The routing (and a wait in the queue) happens before it returns: a
// request no worker can take fails here, with an error wrapping
// sched.ErrOverloaded.
func (r *Router) Generate(ctx context.Context, req sched.Request) (<-chan sched.Output, error) {
	if len(req.Prompt) == 0 || req.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: %d prompt tokens, max_tokens %d", sched.ErrBadRequest, len(req.Prompt), req.MaxTokens)
	}
	ov, err := override(req.Routing)
	if err != nil {
		return nil, err
	}
	arrived := time.Now()
	r.m.arrivals.Inc()
	r.m.promptTokens.Add(float64(len(req.Prompt)))
	if r.workerSet().prefill != nil && req.Transfer == nil {
		return r.generateDisaggregated(ctx, req, ov, arrived)
	}
	d, err := r.route(ctx, req.Prompt, ov)
	if err != nil {
		return nil, err
	}
	out := make(chan sched.Output, 16)
	go r.serve(ctx, req, ov, d, routeAggregated, arrived, out)
	return out, nil
}

// route chooses a worker that serves whole requests for prompt, with the
// request's override ov (nil none), waiting in the queue while every such
// worker is busy.
func (r *Router) route(ctx context.Context, prompt []uint32, ov *policy.Override) (policy.Decision, error) {
	hashes := r.cfg.Namespace.Hashes(prompt)
	tiers := r.lookup(ctx, hashes)
	d, _, err := r.place(ctx, servingPool, policy.Request{Tokens: len(prompt), Blocks: len(hashes), Override: ov}, hashes, tiers, true)
	return d, err
}

// place chooses a worker of the set's pool k for a prompt of hashes whose
// blocks the cache holds in tiers, and returns the decision and the
// chosen candidate. A pool's own override (decode workers are chosen by
// load) takes the place of the request's. While every worker of the pool
// is busy it waits in the queue if wait, else returns the policy's error,
// wrapping policy.ErrAllBusy.
func (r *Router) place(ctx context.Context, k poolKind, preq policy.Request, hashes []index.Hash, tiers []index.TierKind, wait bool) (policy.Decision, policy.Candidate, error) {
	var deadline <-chan time.Time
	queued := false
	defer func() {
		if queued {
			r.mu.Lock()
			r.waiting--
			r.m.queue.Set(float64(r.waiting))
			r.mu.Unlock()
		}
	}()
	for {
		r.mu.Lock()
		freed := r.freed
		r.mu.Unlock()
		// The set is read afresh each time: workers come and go while a
		// request waits.
		p := r.workerSet().pool(k)
		preq := preq
		if p.override != nil {
			preq.Override = p.override
		}
		cands := r.candidates(p, hashes, tiers)
		d, err := r.choose.Choose(preq, cands)
		if err == nil {
			c := cands[d.Index]
			r.m.decisions.WithLabelValues(d.Worker, d.Policy.String()).Inc()
			bt := float64(r.cfg.Namespace.BlockTokens)
			r.m.overlap.WithLabelValues("pool").Observe(float64(c.Overlap))
			r.m.prefixTokens.WithLabelValues("pool").Add(float64(c.Overlap) * bt)
			for t, n := range c.Tiers {
				r.m.overlap.WithLabelValues(index.TierKind(t + 1).String()).Observe(float64(n))
				r.m.prefixTokens.WithLabelValues(index.TierKind(t + 1).String()).Add(float64(n) * bt)
			}
			return d, c, nil
		}
		switch {
		case errors.Is(err, policy.ErrNoWorkers):
			return d, policy.Candidate{}, ErrNoWorkers
		case !errors.Is(err, policy.ErrAllBusy):
			return d, policy.Candidate{}, fmt.Errorf("%w: %v", sched.ErrBadRequest, err)
		case !wait:
			return d, policy.Candidate{}, err
		}
		if !queued {
			r.mu.Lock()
			if r.waiting >= r.cfg.QueueSize {
				r.mu.Unlock()
				return d, policy.Candidate{}, ErrQueueFull
			}
			r.waiting++
			r.m.queue.Set(float64(r.waiting))
			r.mu.Unlock()
			queued = true
			t := time.NewTimer(r.cfg.QueueWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-freed:
		case <-time.After(r.cfg.HealthInterval): // a worker may have come back
		case <-deadline:
			return d, policy.Candidate{}, ErrQueueTimeout
		case <-ctx.Done():
			return d, policy.Candidate{}, ctx.Err()
		}
	}
}

// candidates are the workers of p as the policy sees them for one prompt.
func (r *Router) candidates(p *pool, hashes []index.Hash, tiers []index.TierKind) []policy.Candidate {
	matches := r.kv.Overlap(r.ns, hashes, nil)
	overlap := make(map[kvindex.WorkerID]int, len(matches))
	for _, m := range matches {
		overlap[m.Worker] = m.Blocks
	}
	cands := make([]policy.Candidate, len(p.workers))
	for i, w := range p.workers {
		o := overlap[w.id]
		cands[i] = policy.Candidate{Worker: w.name, Overlap: o, Tiers: policy.TierCounts(tiers, o),
			Capacity: w.blocks, Unhealthy: !w.healthy.Load()}
	}
	return cands
}

// lookup asks the cache where the prompt's blocks are: the fastest tier of
// each leading block it holds. A cache that is absent, down or slower than
// CacheTimeout gives none (no tier credit).
func (r *Router) lookup(ctx context.Context, hashes []index.Hash) []index.TierKind {
	if r.cache == nil || len(hashes) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CacheTimeout)
	defer cancel()
	resp, err := r.cache.Lookup(ctx, r.ns, hashes)
	if err != nil {
		r.m.lookups.WithLabelValues("error").Inc()
		return nil
	}
	r.m.lookups.WithLabelValues("ok").Inc()
	n := min(int(resp.GetBlocks()), len(hashes))
	tiers := make([]index.TierKind, n)
	// Each tier's count is the leading blocks it holds; a block is
	// credited to the fastest tier holding it, and one the cache holds
	// only past every tier's leading run to the slowest tier seen.
	slowest := index.TierKind(0)
	for _, tb := range resp.GetTiers() {
		t, err := index.ParseTierKind(tb.GetTier())
		if err != nil {
			continue
		}
		slowest = max(slowest, t)
		for i := 0; i < min(int(tb.GetBlocks()), n); i++ {
			if tiers[i] == 0 || t < tiers[i] {
				tiers[i] = t
			}
		}
	}
	for i := range tiers {
		if tiers[i] == 0 {
			tiers[i] = slowest
		}
	}
	return tiers
}

// released wakes the requests waiting in the queue: a sequence ended.
func (r *Router) released() {
	r.mu.Lock()
	close(r.freed)
	r.freed = make(chan struct{})
	r.mu.Unlock()
}

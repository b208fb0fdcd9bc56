package frontend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
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

	workers []*worker
	byName  map[string]*worker

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
		byName: map[string]*worker{}, freed: make(chan struct{}),
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
	for i, spec := range cfg.Workers {
		w := &worker{r: r, id: kvindex.WorkerID(i), spec: spec, name: spec.URL, poke: make(chan struct{}, 1)}
		w.healthy.Store(true)
		r.m.healthy.WithLabelValues(w.name).Set(1)
		if err := kv.Register(w.id, cfg.Namespace); err != nil {
			r.Close()
			return nil, err
		}
		if spec.Events != "" {
			sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
				Endpoint: spec.Events, ReplayEndpoint: spec.Replay,
				OnReset: w.clear, OnLost: func(int64, int64) { w.clear() },
			})
			if err != nil {
				r.Close()
				return nil, fmt.Errorf("%w: worker %s: %v", ErrBadConfig, spec.URL, err)
			}
			r.wg.Go(func() { sub.Run(r.ctx, func(_ int64, b *kvevents.Batch) { kv.Apply(w.id, b) }) })
		}
		r.workers = append(r.workers, w)
		r.byName[w.name] = w
		r.wg.Go(w.watch)
	}
	return r, nil
}

// Close stops following the workers and closes the cache client. Requests
// in flight are the caller's to end (their contexts).
func (r *Router) Close() error {
	r.cancel()
	r.wg.Wait()
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
	w, ok := r.byName[url]
	return ok && w.healthy.Load()
}

// Ready is nil while some worker is a candidate, else ErrNoWorkers: what
// the frontend's /health says.
func (r *Router) Ready() error {
	for _, w := range r.workers {
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
	d, err := r.route(ctx, req.Prompt, ov)
	if err != nil {
		return nil, err
	}
	out := make(chan sched.Output, 16)
	go r.serve(ctx, req, ov, d, arrived, out)
	return out, nil
}

// route chooses a worker for prompt, with the request's override ov (nil
// none), waiting in the queue while every worker is busy.
func (r *Router) route(ctx context.Context, prompt []uint32, ov *policy.Override) (policy.Decision, error) {
	hashes := r.cfg.Namespace.Hashes(prompt)
	tiers := r.lookup(ctx, hashes)
	preq := policy.Request{Tokens: len(prompt), Blocks: len(hashes), Override: ov}
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
		cands := r.candidates(hashes, tiers)
		d, err := r.choose.Choose(preq, cands)
		if err == nil {
			c := cands[d.Index]
			r.m.decisions.WithLabelValues(d.Worker, d.Policy.String()).Inc()
			r.m.overlap.WithLabelValues("pool").Observe(float64(c.Overlap))
			for t, n := range c.Tiers {
				r.m.overlap.WithLabelValues(index.TierKind(t + 1).String()).Observe(float64(n))
			}
			return d, nil
		}
		switch {
		case errors.Is(err, policy.ErrNoWorkers):
			return d, ErrNoWorkers
		case !errors.Is(err, policy.ErrAllBusy):
			return d, fmt.Errorf("%w: %v", sched.ErrBadRequest, err)
		}
		if !queued {
			r.mu.Lock()
			if r.waiting >= r.cfg.QueueSize {
				r.mu.Unlock()
				return d, ErrQueueFull
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
			return d, ErrQueueTimeout
		case <-ctx.Done():
			return d, ctx.Err()
		}
	}
}

// candidates are the workers as the policy sees them for one prompt.
func (r *Router) candidates(hashes []index.Hash, tiers []index.TierKind) []policy.Candidate {
	matches := r.kv.Overlap(r.ns, hashes, nil)
	overlap := make(map[kvindex.WorkerID]int, len(matches))
	for _, m := range matches {
		overlap[m.Worker] = m.Blocks
	}
	cands := make([]policy.Candidate, len(r.workers))
	for i, w := range r.workers {
		o := overlap[w.id]
		cands[i] = policy.Candidate{Worker: w.name, Overlap: o, Tiers: policy.TierCounts(tiers, o),
			Capacity: r.cfg.WorkerBlocks, Unhealthy: !w.healthy.Load()}
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

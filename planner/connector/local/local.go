// Package local is the planner's connector for the workers of one
// machine, those `kvstrata up --planner` runs in its process: it scales a
// pool up by spawning workers and adding each to the router once it
// serves, and down by taking the least loaded (the newest, among equals)
// out of the router, draining it — its requests finish, and every block
// it computed reaches the cache — and stopping it. Scale-downs run in the
// background; Replicas counts a draining worker in neither Desired nor
// Ready. Errors are logged and counted, and a worker stays tracked (and
// counted where it is) until it has been stopped.
//
// The workers, how they are spawned and the router are interfaces owned
// here: cmd/kvstrata adapts engine/worker and router/frontend to them.
// A Connector is safe for concurrent use.
package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

var _ planner.Connector = (*Connector)(nil)

// Worker is one worker the connector runs.
type Worker interface {
	// URL is its OpenAI API base, http://host:port: its name in the router.
	URL() string
	// Role is the pool it serves in.
	Role() planner.Pool
	// Drain turns new requests away, waits for the ones it has to finish
	// and for its offloads to reach the cache, within ctx.
	Drain(ctx context.Context) (DrainReport, error)
	// Stop stops it; requests still in flight at ctx's deadline are cut.
	Stop(ctx context.Context) error
}

// DrainReport is what a worker's drain found and did (engine/worker's
// DrainReport).
type DrainReport struct {
	// InFlight are the requests it had when the drain began, Unfinished
	// those it still had when the drain ended.
	InFlight, Unfinished int
	// Offloaded are the blocks queued for the cache during the drain;
	// Dropped those that did not reach it.
	Offloaded, Dropped int
	Took               time.Duration
}

// Spawner starts workers.
type Spawner interface {
	// Spawn starts a worker of pool and returns it serving, or fails
	// within ctx.
	Spawn(ctx context.Context, pool planner.Pool) (Worker, error)
}

// Router is what routes requests to the workers.
type Router interface {
	// AddWorker makes w a candidate for requests.
	AddWorker(w Worker) error
	// RemoveWorker takes the worker of url out of the candidates (the
	// requests it serves go on) and reports whether it was one.
	RemoveWorker(url string) bool
}

// Loads is what a Router may also say: how loaded the worker of url is
// (requests it serves, say). A scale-down drains the least loaded first;
// without it, the newest.
type Loads interface {
	Load(url string) int
}

// Errors.
var (
	// ErrUnknownPool: a pool the connector does not scale.
	ErrUnknownPool = errors.New("local: unknown pool")
	// ErrBadCount: a negative replica count.
	ErrBadCount = errors.New("local: replica count must not be negative")
	// ErrClosed: Scale after Close.
	ErrClosed = errors.New("local: connector closed")
	// ErrBadConfig marks a Config that fails Validate.
	ErrBadConfig = errors.New("local: invalid config")
)

// Config configures a Connector; zero fields take the defaults named.
type Config struct {
	// Spawner starts workers; Router routes to them. Required.
	Spawner Spawner
	Router  Router
	// Pools are the pools it scales, at least one.
	Pools []planner.Pool
	// DrainTimeout bounds one worker's drain; past it the worker is
	// stopped with its requests cut and its queued offloads dropped
	// (counted in its DrainReport). The default is 5 min.
	DrainTimeout time.Duration
	// StopTimeout bounds one worker's Stop. The default is 30 s.
	StopTimeout time.Duration
	// History is how many finished scale-downs Status keeps. The default
	// is 16.
	History int
	// Logger logs every worker started, drained and stopped, and every
	// failure. The default is slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultDrainTimeout = 5 * time.Minute
	DefaultStopTimeout  = 30 * time.Second
	DefaultHistory      = 16
)

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.History == 0 {
		c.History = DefaultHistory
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem with c. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var probs []string
	if c.Spawner == nil {
		probs = append(probs, "Spawner is nil")
	}
	if c.Router == nil {
		probs = append(probs, "Router is nil")
	}
	if len(c.Pools) == 0 {
		probs = append(probs, "Pools is empty: name the pools to scale")
	}
	for _, p := range c.Pools {
		if p != planner.Aggregated && p != planner.Prefill && p != planner.Decode {
			probs = append(probs, fmt.Sprintf("pool %q is unknown: aggregated, prefill or decode", p))
		}
	}
	if c.DrainTimeout < 0 || c.StopTimeout < 0 || c.History < 0 {
		probs = append(probs, "DrainTimeout, StopTimeout and History must not be negative")
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %v", ErrBadConfig, probs)
	}
	return nil
}

// State is where a worker is in its life.
type State string

// States of a worker.
const (
	Starting State = "starting" // being spawned; not in the router yet
	Serving  State = "serving"  // in the router
	Draining State = "draining" // out of the router, finishing and offloading, then stopped
)

// member is one worker the connector tracks, from its spawn to its stop.
type member struct {
	id        uint64 // in the order they came: higher is newer
	pool      planner.Pool
	state     State
	since     time.Time
	w         Worker             // nil while Starting
	cancel    context.CancelFunc // ends a Starting worker's spawn
	cancelled bool               // a scale-down took it while Starting
}

// WorkerStatus is one tracked worker.
type WorkerStatus struct {
	URL   string       `json:"url,omitempty"`
	Pool  planner.Pool `json:"pool"`
	State State        `json:"state"`
	Since time.Time    `json:"since"`
}

// Drained is one finished scale-down of a worker.
type Drained struct {
	URL    string       `json:"url"`
	Pool   planner.Pool `json:"pool"`
	At     time.Time    `json:"at"`
	Report DrainReport  `json:"report"`
	Err    string       `json:"error,omitempty"`
}

// Status is the connector's state, for a status page.
type Status struct {
	Workers []WorkerStatus `json:"workers"`
	// Drained are the last scale-downs, oldest first.
	Drained []Drained `json:"drained"`
	// Errors counts failures: spawns, router changes, drains and stops.
	Errors int `json:"errors"`
}

// Connector scales the pools of one machine's workers.
type Connector struct {
	cfg    Config
	ctx    context.Context // ends spawns and drains at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	members []*member
	next    uint64
	drained []Drained
	errs    int
	closed  bool
}

// New returns a connector over cfg, its zero fields defaulted.
func New(cfg Config) (*Connector, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Connector{cfg: cfg, ctx: ctx, cancel: cancel}, nil
}

// Adopt tracks w, a worker already serving and in the router (one that
// was started with the deployment), as the connector's own.
func (c *Connector) Adopt(w Worker) error {
	if !slices.Contains(c.cfg.Pools, w.Role()) {
		return fmt.Errorf("%w: %q (worker %s)", ErrUnknownPool, w.Role(), w.URL())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.next++
	c.members = append(c.members, &member{id: c.next, pool: w.Role(), state: Serving, since: time.Now(), w: w})
	return nil
}

// Replicas is every pool's size: Desired counts the workers starting and
// serving, Ready those serving; draining workers are in neither.
func (c *Connector) Replicas(context.Context) (map[planner.Pool]planner.Replicas, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[planner.Pool]planner.Replicas, len(c.cfg.Pools))
	for _, p := range c.cfg.Pools {
		out[p] = planner.Replicas{}
	}
	for _, m := range c.members {
		r := out[m.pool]
		switch {
		case m.state == Serving:
			r.Desired++
			r.Ready++
		case m.state == Starting && !m.cancelled:
			r.Desired++
		}
		out[m.pool] = r
	}
	return out, nil
}

// Scale asks for n workers in pool p. New workers are spawned in the
// background and join the router when they serve. Surplus ones go,
// starting ones first (the newest first), then the serving ones least
// loaded first (the newest among equals): those are out of the router when
// Scale returns, and drained and stopped in the background.
func (c *Connector) Scale(_ context.Context, p planner.Pool, n int) error {
	if !slices.Contains(c.cfg.Pools, p) {
		return fmt.Errorf("%w: %q", ErrUnknownPool, p)
	}
	if n < 0 {
		return fmt.Errorf("%w: %s %d", ErrBadCount, p, n)
	}
	victims, err := c.scale(p, n)
	for _, m := range victims {
		c.remove(m)
		go func() {
			defer c.wg.Done() // added by scale
			c.drain(m)
		}()
	}
	return err
}

// scale starts n's new workers, cancels the starting ones it does not
// need, and returns the serving ones to drain, marked Draining and
// counted in c.wg (under c.mu, so that Close waits for them).
func (c *Connector) scale(p planner.Pool, n int) ([]*member, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	var starting, serving []*member
	for _, m := range c.members {
		switch {
		case m.pool != p:
		case m.state == Starting && !m.cancelled:
			starting = append(starting, m)
		case m.state == Serving:
			serving = append(serving, m)
		}
	}
	have := len(starting) + len(serving)
	for range n - have {
		c.next++
		m := &member{id: c.next, pool: p, state: Starting, since: time.Now()}
		ctx, cancel := context.WithCancel(c.ctx)
		m.cancel = cancel
		c.members = append(c.members, m)
		c.wg.Go(func() { c.start(ctx, m) })
	}
	if n >= have {
		if n > have {
			c.cfg.Logger.Info("local: scaling up", "pool", p, "from", have, "to", n)
		}
		return nil, nil
	}
	c.cfg.Logger.Info("local: scaling down", "pool", p, "from", have, "to", n)
	surplus := have - n
	for i := len(starting) - 1; i >= 0 && surplus > 0; i-- {
		m := starting[i]
		m.cancelled = true
		m.cancel()
		surplus--
	}
	loads, _ := c.cfg.Router.(Loads)
	load := map[*member]int{}
	if loads != nil {
		for _, m := range serving {
			load[m] = loads.Load(m.w.URL())
		}
	}
	slices.SortFunc(serving, func(a, b *member) int {
		return cmp.Or(cmp.Compare(load[a], load[b]), cmp.Compare(b.id, a.id))
	})
	for _, m := range serving[:surplus] {
		m.state, m.since = Draining, time.Now()
		c.wg.Add(1)
	}
	return serving[:surplus], nil
}

// start spawns m's worker and adds it to the router; a worker whose
// scale-down came meanwhile is stopped (or, once in the router, drained).
func (c *Connector) start(ctx context.Context, m *member) {
	w, err := c.cfg.Spawner.Spawn(ctx, m.pool)
	if err != nil {
		c.fail("spawning a worker", err, "pool", m.pool)
		c.forget(m)
		return
	}
	c.mu.Lock()
	m.w = w
	cancelled := m.cancelled
	c.mu.Unlock()
	if cancelled {
		c.cfg.Logger.Info("local: worker started after its scale-down; stopping it", "worker", w.URL(), "pool", m.pool)
		c.stop(m)
		c.forget(m)
		return
	}
	if err := c.cfg.Router.AddWorker(w); err != nil {
		c.fail("adding a worker to the router", err, "worker", w.URL())
		c.stop(m)
		c.forget(m)
		return
	}
	c.mu.Lock()
	if m.cancelled { // a scale-down while it joined the router
		m.state, m.since = Draining, time.Now()
		c.mu.Unlock()
		c.remove(m)
		c.drain(m)
		return
	}
	m.state, m.since = Serving, time.Now()
	c.mu.Unlock()
	c.cfg.Logger.Info("local: worker serving", "worker", w.URL(), "pool", m.pool)
}

// remove takes m out of the router.
func (c *Connector) remove(m *member) {
	if !c.cfg.Router.RemoveWorker(m.w.URL()) {
		c.cfg.Logger.Warn("local: the router did not have the worker being scaled down", "worker", m.w.URL())
	}
}

// drain drains m, out of the router, within DrainTimeout and stops it.
func (c *Connector) drain(m *member) {
	url := m.w.URL()
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DrainTimeout)
	rep, err := m.w.Drain(ctx)
	cancel()
	d := Drained{URL: url, Pool: m.pool, At: time.Now(), Report: rep}
	if err != nil {
		d.Err = err.Error()
		c.fail("draining a worker", err, "worker", url, "dropped_blocks", rep.Dropped, "unfinished", rep.Unfinished)
	} else {
		c.cfg.Logger.Info("local: worker drained", "worker", url, "requests", rep.InFlight, "offloaded_blocks", rep.Offloaded,
			"dropped_blocks", rep.Dropped, "took", rep.Took.Round(time.Millisecond))
	}
	c.stop(m)
	c.mu.Lock()
	c.drained = append(c.drained, d)
	if len(c.drained) > c.cfg.History {
		c.drained = slices.Delete(c.drained, 0, len(c.drained)-c.cfg.History)
	}
	c.mu.Unlock()
	c.forget(m)
}

// stop stops m's worker within StopTimeout.
func (c *Connector) stop(m *member) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StopTimeout)
	defer cancel()
	if err := m.w.Stop(ctx); err != nil {
		c.fail("stopping a worker", err, "worker", m.w.URL())
		return
	}
	c.cfg.Logger.Info("local: worker stopped", "worker", m.w.URL(), "pool", m.pool)
}

// forget stops tracking m, whose worker is stopped or never started.
func (c *Connector) forget(m *member) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members = slices.DeleteFunc(c.members, func(o *member) bool { return o == m })
}

func (c *Connector) fail(what string, err error, attrs ...any) {
	c.mu.Lock()
	c.errs++
	c.mu.Unlock()
	c.cfg.Logger.Warn("local: "+what+" failed", append(attrs, "err", err)...)
}

// Status is the workers tracked now, the last scale-downs and the count
// of failures.
func (c *Connector) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Workers: []WorkerStatus{}, Drained: slices.Clone(c.drained), Errors: c.errs}
	if st.Drained == nil {
		st.Drained = []Drained{}
	}
	for _, m := range c.members {
		ws := WorkerStatus{Pool: m.pool, State: m.state, Since: m.since}
		if m.w != nil {
			ws.URL = m.w.URL()
		}
		st.Workers = append(st.Workers, ws)
	}
	return st
}

// Close scales nothing more: it ends the spawns in progress, waits for
// the scale-downs in progress until ctx ends (then cuts them short), and
// stops every serving worker within ctx. Call it once.
func (c *Connector) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	for _, m := range c.members {
		if m.state == Starting {
			m.cancelled = true
			m.cancel()
		}
	}
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		c.cancel() // drains end now; their workers are stopped
		<-done
	}
	c.cancel()
	c.mu.Lock()
	serving := slices.Clone(c.members)
	c.mu.Unlock()
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, m := range serving {
		wg.Go(func() {
			if err := m.w.Stop(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("local: stop %s: %w", m.w.URL(), err))
				mu.Unlock()
			}
			c.forget(m)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

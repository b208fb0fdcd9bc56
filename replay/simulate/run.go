package simulate

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/router/kvindex"
	"github.com/kvstrata/kvstrata/router/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// epoch is virtual time zero: the trace's timestamp 0.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ErrStuck marks a simulation that stopped making progress with requests
// unfinished: a bug of the model, never an outcome of a policy.
var ErrStuck = errors.New("simulate: the simulation stopped making progress")

// Run replays reqs once per policy of cfg, then once per baseline without
// the cache, and all of that once per scaler of cfg.Scalers (if any),
// Config.Parallel runs at a time (each run is independent and
// deterministic), and returns one Row per run, in cfg.Scalers' order, and
// for each in cfg.Policies' order, then cfg.Baselines'. Every request must have a prompt (replay.Prompts'
// Check): the first that has none is an error matching replay.ErrPrompt,
// before anything runs. If a run fails or ctx ends, Run returns the rows
// of the policies before it with the error.
func Run(ctx context.Context, reqs []trace.Request, cfg Config) ([]Row, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: the trace has no requests", replay.ErrPrompt)
	}
	prompts := replay.Prompts{Vocab: cfg.Vocab, Seed: cfg.Seed}
	for i, r := range reqs {
		if err := prompts.Check(r); err != nil {
			return nil, fmt.Errorf("request %d: %w", i+1, err)
		}
		if i > 0 && r.Timestamp < reqs[i-1].Timestamp {
			return nil, fmt.Errorf("%w: request %d's timestamp %d is before request %d's %d: a trace is in time order",
				replay.ErrPrompt, i+1, r.Timestamp, i, reqs[i-1].Timestamp)
		}
	}
	if cfg.Progress != nil { // the runs report from their goroutines
		var mu sync.Mutex
		progress := cfg.Progress
		cfg.Progress = func(p policy.Policy, done, total int) {
			mu.Lock()
			defer mu.Unlock()
			progress(p, done, total)
		}
	}
	type job struct {
		p      policy.Policy
		cached bool
		s      NamedScaler
	}
	var jobs []job
	scalers := cfg.Scalers
	if len(scalers) == 0 {
		scalers = []NamedScaler{{}}
	}
	for _, s := range scalers {
		for _, p := range cfg.Policies {
			jobs = append(jobs, job{p, true, s})
		}
		for _, p := range cfg.Baselines {
			jobs = append(jobs, job{p, false, s})
		}
	}
	rows := make([]Row, len(jobs))
	errs := make([]error, len(jobs))
	slots := make(chan struct{}, cfg.Parallel)
	var wg sync.WaitGroup
	for i, j := range jobs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			rows[i], errs[i] = runPolicy(ctx, reqs, &cfg, prompts, j.p, j.cached, j.s)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return rows[:i], err
		}
	}
	return rows, nil
}

// worker is one simulated worker: a driven sched.Engine over a sim model,
// both on the worker's own virtual clock.
type worker struct {
	id     kvindex.WorkerID
	name   string
	clock  *sim.VirtualClock
	eng    *sched.Engine
	model  *sim.Model
	active []*request
	// pending is what the step in progress produced, delivered at its end:
	// outputs, and the pool's event batches for the router's index.
	pending []delivery
	batches []*kvevents.Batch
	// next is when the worker's next event is due, if scheduled.
	next      time.Time
	scheduled bool
	// state is where the worker is in its life; added and retiredAt when
	// it was added and retired; preemptions its engine's, once closed.
	state            workerState
	added, retiredAt time.Time
	preemptions      uint64
}

type delivery struct {
	r   *request
	out sched.Output
}

// request is one trace request in flight.
type request struct {
	i       int
	arrival time.Time
	prompt  []uint32
	hashes  []index.Hash // the prompt's full blocks, until it is routed
	w       *worker
	out     <-chan sched.Output
	seq     *policy.Sequence
	first   bool
	last    time.Time
	res     replay.Result
}

// sink is a worker's sched.EventSink: the pool's events, as the vLLM events
// a PoolSink publishes, batched per step for the router's index.
type sink struct {
	w     *worker
	batch []kvevents.Event
}

func (s *sink) Event(e pool.Event) {
	if ev := kvevents.PoolEvent(e, kvevents.MediumGPU, kvevents.HashInts); ev != nil {
		s.batch = append(s.batch, ev)
	}
}

func (s *sink) Flush() {
	if len(s.batch) > 0 {
		s.w.batches = append(s.w.batches, &kvevents.Batch{Events: s.batch})
		s.batch = nil
	}
}

// run is one policy's simulation.
type run struct {
	cfg     *Config
	pol     policy.Policy
	reqs    []trace.Request
	prompts replay.Prompts
	router  *policy.Router
	kv      *kvindex.Index
	cache   *cache // nil for a baseline without the cache
	// workers are every worker the run added, retired ones included, in
	// the order of their ids; serving are the routing candidates.
	workers []*worker
	serving []*worker
	// scaler sizes the deployment (nil: fixed); win is its window so far.
	scaler     Scaler
	scalerName string
	win        Window
	// held counts the workers added and not retired, heldMax its maximum;
	// scaleUps and scaleDowns the ticks that added and removed workers.
	held, heldMax        int
	scaleUps, scaleDowns int
	// newWorker is the run's settings for a worker; err the first error
	// adding one failed with.
	newWorker func(id kvindex.WorkerID) (*worker, error)

	ns      index.Namespace
	nsID    index.NamespaceID
	events  eventQueue
	ord     uint64
	queue   []*request // waiting for a worker that is not busy
	results []replay.Result
	done    int
	// queued counts requests that waited in the queue, queueWait their
	// waits; hbmTokens the prompt tokens found in the workers' own pools.
	queued    int
	queueWait time.Duration
	hbmTokens int64
	now       time.Time
	err       error
	// perf is the workers' model, for the SLO's TTFT alone.
	perf perf.Model
}

// runPolicy is one run of policy p, with the cache if cached, else with
// workers and a router that have none, sized by s.
func runPolicy(ctx context.Context, reqs []trace.Request, cfg *Config, prompts replay.Prompts, p policy.Policy, cached bool, s NamedScaler) (Row, error) {
	wallStart := time.Now()
	r := &run{cfg: cfg, pol: p, reqs: reqs, prompts: prompts, results: make([]replay.Result, len(reqs)), scalerName: s.Name, now: epoch}
	initial := cfg.Workers
	if s.Workers > 0 {
		initial = s.Workers
	}
	if r.scalerName == "" {
		r.scalerName = fmt.Sprintf("static:%d", initial)
	}
	if s.New != nil {
		r.scaler = s.New()
	}
	var err error
	pcfg := policy.Config{Policy: p, BlockTokens: cfg.BlockTokens, BlockBytes: cfg.blockBytes(), Profile: cfg.Profile, Seed: cfg.Seed}
	if cached {
		if r.cache, err = newCache(cfg); err != nil {
			return Row{}, err
		}
		defer r.cache.close()
		for i, t := range cfg.Tiers {
			pcfg.Tiers[r.cache.kinds[i]-1] = policy.TierCost{Bandwidth: t.Bandwidth, Latency: max(t.Latency, time.Nanosecond)}
		}
	}
	if r.perf, err = perf.New(*cfg.Profile, sim.WorkerLimits{KVTokens: cfg.PoolTokens, BlockTokens: cfg.BlockTokens,
		MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens}); err != nil {
		return Row{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if r.kv, err = kvindex.New(nil); err != nil {
		return Row{}, err
	}
	if r.router, err = policy.New(pcfg); err != nil {
		return Row{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	quiet := slog.New(slog.DiscardHandler)
	r.newWorker = func(id kvindex.WorkerID) (*worker, error) {
		w := &worker{id: id, name: fmt.Sprintf("worker-%d", id), clock: sim.NewVirtualClock(epoch), added: r.now}
		w.clock.AdvanceTo(r.now)
		// The workers keep 4 bytes of KV a token (one layer, head dim 1):
		// the modelled bytes are Config.TokenBytes, for restore times only.
		var err error
		w.model, err = sim.New(sim.Config{Layers: 1, TokenBytes: 4, BlockTokens: cfg.BlockTokens,
			Capacity: cfg.PoolTokens, Profile: cfg.Profile, Sleep: w.clock.Sleep})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		scfg := sched.Config{
			Model: w.model, Blocks: cfg.PoolTokens / cfg.BlockTokens,
			MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
			MaxWaiting: len(reqs) + 1, CacheTimeout: cfg.CacheTimeout,
			Events: &sink{w: w}, Logger: quiet, Now: w.clock.Now,
		}
		if cached {
			scfg.Connector = connector{c: r.cache, clock: w.clock}
		}
		w.eng, err = sched.NewDriven(scfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if id == 0 {
			r.ns = w.model.Layout().Namespace
			r.nsID = r.ns.ID()
		}
		if err := r.kv.Register(w.id, r.ns); err != nil {
			w.eng.Close()
			return nil, err
		}
		return w, nil
	}
	defer func() {
		for _, w := range r.workers {
			if w.eng != nil {
				w.eng.Close()
			}
		}
	}()
	for range initial {
		if _, err := r.addWorker(serving); err != nil {
			return Row{}, err
		}
	}
	r.windowReset()
	if r.scaler != nil {
		r.scheduleEvent(event{at: epoch.Add(cfg.ScaleInterval), kind: evTick})
	}

	if err := r.loop(ctx); err != nil {
		return Row{}, err
	}
	return r.row(time.Since(wallStart)), nil
}

// addWorker adds a worker in state st (serving or starting), with the next
// id.
func (r *run) addWorker(st workerState) (*worker, error) {
	w, err := r.newWorker(r.nextID())
	if err != nil {
		return nil, err
	}
	w.state = st
	r.workers = append(r.workers, w)
	if st == serving {
		r.serving = append(r.serving, w)
	}
	r.held++
	r.heldMax = max(r.heldMax, r.held)
	r.watch(w)
	return w, nil
}

// loop runs the events in time order: arrivals at their timestamps over
// the speedup, the scaler's ticks, workers becoming ready, and each
// worker's steps one after the other. At equal times an arrival comes
// first, then ticks, then readiness, then workers' steps in the order
// they were scheduled.
func (r *run) loop(ctx context.Context) error {
	next := 0 // the next arrival
	idle := 0 // events in a row that moved no time and ended nothing
	for n := 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		var at time.Time
		arrival := next < len(r.reqs)
		if arrival {
			at = epoch.Add(time.Duration(float64(r.reqs[next].Timestamp) * float64(time.Millisecond) / r.cfg.Speedup))
		}
		if len(r.events) > 0 && (!arrival || r.events[0].at.Before(at)) {
			ev := heap.Pop(&r.events).(event)
			switch ev.kind {
			case evTick:
				if r.done < len(r.reqs) { // no ticks once every request ended
					r.now = ev.at
					r.tick()
				}
				if r.err != nil {
					return r.err
				}
				continue
			case evReady:
				r.now = ev.at
				r.ready(ev.w)
				continue
			}
			if ev.w.state == retired {
				// A worker that routed a request to itself during its step
				// has a second event; the first retired it, idle.
				continue
			}
			before := r.done
			r.now = ev.at
			r.step(ev.w)
			if ev.w.next.Equal(ev.at) && ev.w.scheduled && r.done == before {
				if idle++; idle > 1<<20 {
					return fmt.Errorf("%w: %s steps without time passing at %v", ErrStuck, ev.w.name, ev.at.Sub(epoch))
				}
			} else {
				idle = 0
			}
			continue
		}
		if !arrival {
			break
		}
		r.now = at
		r.arrive(next)
		next++
	}
	if r.done < len(r.reqs) {
		return fmt.Errorf("%w: %d of %d requests did not finish (%d waiting for a worker)", ErrStuck, len(r.reqs)-r.done, len(r.reqs), len(r.queue))
	}
	return nil
}

// arrive queues request i and routes what the queue can.
func (r *run) arrive(i int) {
	prompt, err := r.prompts.Tokens(r.reqs[i])
	q := &request{i: i, arrival: r.now, prompt: prompt}
	q.res.Sent = r.now
	if err != nil { // Run checked every request
		r.fail(q, "prompt", err)
		return
	}
	q.hashes = r.ns.Hashes(prompt)
	r.win.Arrivals++
	r.win.PromptTokens += int64(len(prompt))
	r.queue = append(r.queue, q)
	r.route()
}

// route routes the queue's requests in order while a worker takes them.
func (r *run) route() {
	for len(r.queue) > 0 {
		q := r.queue[0]
		if !r.choose(q) {
			return
		}
		r.queue = r.queue[1:]
		if w := r.now.Sub(q.arrival); w > 0 {
			r.queued++
			r.queueWait += w
		}
	}
}

// choose routes q as the frontend does: the pool overlap of each worker
// from the KV-event index, the cache tiers of the prompt's blocks, the
// policy's choice; and hands it to the chosen worker. It reports false
// when every worker is busy and q must wait.
func (r *run) choose(q *request) bool {
	hashes := q.hashes
	var kinds []index.TierKind // what the cache holds: nothing without one
	if r.cache != nil {
		kinds = r.cache.where(r.nsID, hashes)
	}
	cands := r.candidates(hashes, kinds)
	d, err := r.router.Choose(policy.Request{Tokens: len(q.prompt), Blocks: len(hashes)}, cands)
	switch {
	case errors.Is(err, policy.ErrAllBusy):
		return false
	case err != nil:
		r.fail(q, "route", err)
		return true
	}
	w := r.serving[d.Index]
	out, err := w.eng.Generate(context.Background(), sched.Request{
		ID: fmt.Sprint(q.i), Prompt: q.prompt, MaxTokens: int(r.reqs[q.i].OutputLength), IgnoreEOS: true,
	})
	q.prompt, q.hashes = nil, nil // the engine has its copy
	if err != nil {
		d.Seq.Done()
		r.fail(q, "rejected", err)
		return true
	}
	q.w, q.out, q.seq = w, out, d.Seq
	w.active = append(w.active, q)
	if !w.scheduled {
		w.clock.AdvanceTo(r.now)
		r.schedule(w, r.now)
	}
	return true
}

// candidates are the workers as router/frontend builds them for the
// policy.
func (r *run) candidates(hashes []index.Hash, kinds []index.TierKind) []policy.Candidate {
	overlap := make(map[kvindex.WorkerID]int, len(r.serving))
	for _, m := range r.kv.Overlap(r.nsID, hashes, nil) {
		overlap[m.Worker] = m.Blocks
	}
	if r.cfg.onCandidates != nil {
		r.cfg.onCandidates(r.serving)
	}
	cands := make([]policy.Candidate, len(r.serving))
	for i, w := range r.serving {
		o := overlap[w.id]
		cands[i] = policy.Candidate{Worker: w.name, Overlap: o, Tiers: policy.TierCounts(kinds, o),
			Capacity: r.cfg.PoolTokens / r.cfg.BlockTokens}
	}
	return cands
}

// step is worker w's event: the end of its previous step, whose outputs
// and pool events are delivered now, then its next step, if it has work.
func (r *run) step(w *worker) {
	w.scheduled = false
	for _, b := range w.batches {
		_ = r.kv.Apply(w.id, b) // w is registered
	}
	w.batches = w.batches[:0]
	pending := w.pending
	w.pending = nil
	lighter := false
	for _, d := range pending {
		lighter = r.deliver(d.r, d.out) || lighter
	}
	if lighter && len(r.queue) > 0 {
		r.route() // a first token or an end lightens the router's view of the load
	}

	more := w.eng.Step()
	for _, q := range w.active {
		for taken := true; taken; {
			select {
			case o, ok := <-q.out:
				if ok {
					w.pending = append(w.pending, delivery{q, o})
				}
				taken = ok
			default:
				taken = false
			}
		}
	}
	if end := w.clock.Now(); more || len(w.pending) > 0 || len(w.batches) > 0 || end.After(r.now) {
		r.schedule(w, end)
	}
	r.retireIfDone(w)
}

// deliver takes one Output of q at the current time and reports whether
// it was q's first token or its end, which lighten the load the router
// sees.
func (r *run) deliver(q *request, o sched.Output) bool {
	lighter := false
	if k := len(o.Tokens); k > 0 {
		r.win.OutputTokens += int64(k)
		if !q.first {
			q.first, lighter = true, true
			q.res.TTFT = r.now.Sub(q.arrival)
			q.seq.FirstToken()
			r.win.TTFTSum += q.res.TTFT
			r.win.TTFTCount++
		} else {
			gap := r.now.Sub(q.last) / time.Duration(k)
			for range k {
				q.res.ITL = append(q.res.ITL, gap)
			}
			r.win.ITLSum += gap * time.Duration(k)
			r.win.ITLCount += k
		}
		q.last = r.now
	}
	if o.Finish == "" {
		return lighter
	}
	q.seq.Done()
	w := q.w
	for i, a := range w.active {
		if a == q {
			w.active = append(w.active[:i], w.active[i+1:]...)
			break
		}
	}
	if o.Finish == sched.FinishAbort {
		r.fail(q, "abort", o.Err)
		return true
	}
	q.res.E2E = r.now.Sub(q.arrival)
	q.res.PromptTokens = int64(o.Usage.PromptTokens)
	q.res.CachedTokens = int64(o.Usage.CachedTokens)
	q.res.OutputTokens = int64(o.Usage.CompletionTokens)
	r.win.CachedTokens += int64(o.Usage.CachedTokens)
	r.hbmTokens += int64(o.Usage.CachedTokens - o.Usage.OnboardedTokens)
	r.end(q)
	return true
}

func (r *run) fail(q *request, kind string, err error) {
	q.res.ErrKind, q.res.Err = kind, err
	r.end(q)
}

func (r *run) end(q *request) {
	r.results[q.i] = q.res
	r.done++
	r.win.Finished++
	if r.cfg.Progress != nil {
		r.cfg.Progress(r.pol, r.done, len(r.reqs))
	}
}

func (r *run) schedule(w *worker, at time.Time) {
	w.scheduled, w.next = true, at
	r.scheduleEvent(event{at: at, kind: evStep, w: w})
}

func (r *run) scheduleEvent(e event) {
	r.ord++
	e.ord = r.ord
	heap.Push(&r.events, e)
}

// event is a scaler's tick, a worker becoming ready or a worker's next
// step; at equal times they come in that order, and ord keeps events of
// one kind in schedule order.
type event struct {
	at   time.Time
	kind eventKind
	ord  uint64
	w    *worker
}

type eventKind int

const (
	evTick eventKind = iota
	evReady
	evStep
)

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	return q[i].ord < q[j].ord
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

package frontend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/router/kvindex"
)

// This file holds the Router's set of workers, which changes while it
// runs: the static list of Config.Workers, plus the workers the cache
// cluster's registry lists when Config.Discover is set (discover.go).

// ErrWorkerExists: AddWorker of a URL the Router has already.
var ErrWorkerExists = errors.New("frontend: the worker is there already")

// retireAfter is how long a removed worker can still be found by name: a
// request routed to it just before its removal still reaches it (and, if
// it is gone, moves on as from any failed worker).
const retireAfter = time.Minute

// workerSet is the Router's workers at one moment; never changed once
// published, so that a request reads it with no lock.
type workerSet struct {
	list   []*worker          // the workers, in the order they came
	byName map[string]*worker // those, and the ones retired for less than retireAfter
	// serving are the workers that serve whole requests: all of them, or
	// the decode workers when the set is disaggregated; prefill, then,
	// the prefill workers (nil when aggregated). See pools.
	serving, prefill *pool
}

// newWorkerSet returns the set of list, whose workers and retired ones
// byName names.
func newWorkerSet(list []*worker, byName map[string]*worker) *workerSet {
	s := &workerSet{list: list, byName: byName}
	s.serving, s.prefill = pools(list)
	return s
}

var noWorkers = newWorkerSet(nil, map[string]*worker{})

// workerSet returns the current workers.
func (r *Router) workerSet() *workerSet {
	if s := r.set.Load(); s != nil {
		return s
	}
	return noWorkers
}

// Workers returns the specs of the current workers, in the order they
// came.
func (r *Router) Workers() []WorkerSpec {
	s := r.workerSet()
	out := make([]WorkerSpec, len(s.list))
	for i, w := range s.list {
		out[i] = w.spec
	}
	return out
}

// AddWorker makes the worker of spec a candidate: it follows its KV events
// and health from now on. A URL the Router has already is ErrWorkerExists;
// a spec that is not valid wraps ErrBadConfig.
func (r *Router) AddWorker(spec WorkerSpec) error { return r.addWorker(spec, false) }

// RemoveWorker takes the worker of url out of the candidates and stops
// following it; requests it is serving go on (or move, if it fails). It
// reports whether the Router had the worker.
func (r *Router) RemoveWorker(url string) bool {
	r.setMu.Lock()
	defer r.setMu.Unlock()
	return r.removeLocked(url)
}

// checkSpec reports what is wrong with one worker's spec.
func checkSpec(w WorkerSpec) []string {
	var probs []string
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		probs = append(probs, fmt.Sprintf("worker URL %q is not http://host:port", w.URL))
	}
	if w.Replay != "" && w.Events == "" && w.Topic == "" {
		probs = append(probs, fmt.Sprintf("worker %q has a replay endpoint but no events endpoint or topic", w.URL))
	}
	if w.Blocks < 0 {
		probs = append(probs, fmt.Sprintf("worker %q has %d blocks, must be ≥ 0", w.URL, w.Blocks))
	}
	return probs
}

// addWorker adds the worker of spec; static says it came from
// Config.Workers, which discovery never removes.
func (r *Router) addWorker(spec WorkerSpec, static bool) error {
	if probs := checkSpec(spec); len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadConfig, probs[0])
	}
	r.setMu.Lock()
	defer r.setMu.Unlock()
	old := r.workerSet()
	if slices.ContainsFunc(old.list, func(w *worker) bool { return w.name == spec.URL }) {
		return fmt.Errorf("%w: %s", ErrWorkerExists, spec.URL)
	}
	r.nextID++
	w := &worker{r: r, id: kvindex.WorkerID(r.nextID), spec: spec, name: spec.URL, static: static, poke: make(chan struct{}, 1)}
	w.blocks = spec.Blocks
	if w.blocks == 0 {
		w.blocks = r.cfg.WorkerBlocks
	}
	w.ctx, w.stop = context.WithCancel(r.ctx)
	if err := r.kv.Register(w.id, r.cfg.Namespace); err != nil {
		w.stop()
		return err
	}
	if err := r.followEvents(w); err != nil {
		w.stop()
		_ = r.kv.RemoveWorker(w.id)
		return err
	}
	w.healthy.Store(true)
	r.m.healthy.WithLabelValues(w.name).Set(1)
	next := newWorkerSet(append(slices.Clip(old.list), w), r.liveNames(old))
	next.byName[w.name] = w
	r.set.Store(next)
	delete(r.retired, w.name)
	w.watched = make(chan struct{})
	r.wg.Go(func() {
		defer close(w.watched)
		w.watch()
	})
	if !static {
		r.cfg.Logger.Info("frontend: worker added", "worker", w.name, "events", orNoEvents(spec.Events))
	}
	r.released() // a request waiting for a free worker may take it
	return nil
}

// removeLocked removes the worker of url; r.setMu is held.
func (r *Router) removeLocked(url string) bool {
	old := r.workerSet()
	i := slices.IndexFunc(old.list, func(w *worker) bool { return w.name == url })
	if i < 0 {
		return false
	}
	w := old.list[i]
	r.retired[url] = time.Now()
	next := newWorkerSet(slices.Delete(slices.Clone(old.list), i, i+1), r.liveNames(old))
	r.set.Store(next)
	// Its watch ends first (its health check is cut short), so that no
	// late result of it marks the worker healthy again.
	w.stop()
	<-w.watched
	w.healthy.Store(false)
	_ = r.kv.RemoveWorker(w.id)
	r.m.healthy.DeleteLabelValues(w.name)
	if w.collector != nil {
		r.cfg.Registerer.Unregister(w.collector) // a worker of that URL may register again
	}
	r.cfg.Logger.Info("frontend: worker removed", "worker", w.name)
	return true
}

// liveNames returns a new byName of old's workers and those retired less
// than retireAfter ago, forgetting the others; r.setMu is held.
func (r *Router) liveNames(old *workerSet) map[string]*worker {
	names := make(map[string]*worker, len(old.byName))
	for name, w := range old.byName {
		if at, ok := r.retired[name]; ok && time.Since(at) > retireAfter {
			delete(r.retired, name)
			continue
		}
		names[name] = w
	}
	for _, w := range old.list {
		names[w.name] = w
	}
	return names
}

// setDiscovered makes the workers that discovery manages those of specs:
// it adds the new ones, removes the ones no longer listed and replaces
// those whose spec changed. Static workers stay as they are, and a listed
// URL that is a static worker's is skipped. It returns what failed to be
// added.
func (r *Router) setDiscovered(specs []WorkerSpec) error {
	want := make(map[string]WorkerSpec, len(specs))
	for _, s := range specs {
		want[s.URL] = s
	}
	r.setMu.Lock()
	cur := r.workerSet()
	var add []WorkerSpec
	have := map[string]bool{}
	for _, w := range cur.list {
		have[w.name] = true
		if w.static {
			delete(want, w.name)
			continue
		}
		if s, ok := want[w.name]; !ok || s != w.spec {
			r.removeLocked(w.name)
			have[w.name] = false
		}
	}
	for _, url := range slices.Sorted(maps.Keys(want)) {
		if !have[url] {
			add = append(add, want[url])
		}
	}
	r.setMu.Unlock()
	var errs []error
	for _, s := range add {
		if err := r.addWorker(s, false); err != nil && !errors.Is(err, ErrWorkerExists) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func orNoEvents(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

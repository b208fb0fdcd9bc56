package frontend

import (
	"context"
	"time"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// This file follows the cache cluster's worker registry (Config.Discover):
// workers register themselves with the cluster (`kvstrata worker
// --register`), with a lease they renew, and every frontend replica,
// whichever cache node it asks, lists the same set.
//
// The loop is level-triggered: every DiscoverInterval it lists the
// registry and makes the discovered workers those listed, so a missed
// pass, a restart of the frontend or of the cache node leaves nothing
// inconsistent. A list that fails changes nothing: a cache that is down
// does not empty the candidates. Leases only bound how long a worker that
// vanished without deregistering stays listed; the Router does not wait
// for them: a worker whose connection fails, whose stream breaks or whose
// /health fails leaves the candidates within about a second, as a static
// worker does, and comes back when healthy if it is still listed.
//
// Workers of every role are taken: prefill workers join the prefill pool,
// the others the serving one (pools), so that registered prefill and
// decode workers serve disaggregated as a static list of them does. The
// registry may list any mix at a given moment (a rollout, a pool of
// workers that has not come up yet, leases that end), and each serves:
//   - aggregated or decode workers only: aggregated serving, by the
//     Router's policy (a decode worker prefills what it is sent itself);
//   - prefill workers with decode or aggregated ones: disaggregated, the
//     second kind decoding, chosen by their load (an aggregated kvstrata
//     worker with a cache loads the prefilled blocks as a decode one does;
//     one without recomputes them: the answer is the same);
//   - prefill workers only: none serves whole requests; the Router is not
//     Ready and requests fail with ErrNoWorkers (503) until one comes.

// discover lists the registry every DiscoverInterval until the Router
// closes.
func (r *Router) discover() {
	failing := false
	for {
		err := r.discoverOnce()
		switch {
		case err != nil && !failing:
			r.cfg.Logger.Warn("frontend: listing the worker registry failed; keeping the workers known", "cache", r.cfg.Cache, "err", err)
		case err == nil && failing:
			r.cfg.Logger.Info("frontend: listing the worker registry works again", "cache", r.cfg.Cache)
		}
		failing = err != nil
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(r.cfg.DiscoverInterval):
		}
	}
}

// discoverOnce lists the registry once and updates the workers.
func (r *Router) discoverOnce() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.DiscoverInterval)
	defer cancel()
	recs, err := r.cache.ListWorkers(ctx)
	if err != nil {
		return err
	}
	return r.setDiscovered(r.discovered(recs))
}

// discovered returns the specs of the registered workers that are this
// Router's, each in its role.
func (r *Router) discovered(recs []*pb.WorkerRecord) []WorkerSpec {
	var specs []WorkerSpec
	for _, rec := range recs {
		if r.serves(rec) {
			specs = append(specs, WorkerSpec{URL: rec.GetUrl(), Events: rec.GetEvents(), Replay: rec.GetReplay(),
				Blocks: int(min(rec.GetPoolBlocks(), 1<<31-1)), Role: rec.GetRole()})
		}
	}
	return specs
}

// serves reports whether a registered worker is one of this Router's: its
// block namespace is the Router's (or unknown), and its role is one the
// Router knows (a newer worker's other role is left out).
func (r *Router) serves(rec *pb.WorkerRecord) bool {
	if ns := rec.GetNamespace(); ns != 0 && ns != uint64(r.ns) {
		return false
	}
	switch rec.GetRole() {
	case "", RoleAggregated, RolePrefill, RoleDecode:
		return true
	}
	return false
}

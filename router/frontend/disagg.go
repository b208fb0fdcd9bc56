package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/router/policy"
)

// Roles of the workers of the list (WorkerSpec.Role), as `kvstrata worker
// --role` names them.
const (
	// RoleAggregated workers prefill and decode the requests they serve.
	RoleAggregated = "aggregated"
	// RolePrefill workers prefill prompts for decode workers: they store
	// the prompt's blocks in kvstrata and answer kv_transfer_params.
	RolePrefill = "prefill"
	// RoleDecode workers serve requests whose prompts a prefill worker
	// computed, onboarding its blocks; short ones they prefill themselves.
	RoleDecode = "decode"
)

// Routes a request takes, the route label of the request, TTFT and
// duration metrics.
const (
	// routeAggregated: one worker prefilled and decoded it (an aggregated
	// list, or a request that brought its own kv_transfer_params).
	routeAggregated = "aggregated"
	// routeDisaggregated: a prefill worker prefilled it, a decode worker
	// decoded it.
	routeDisaggregated = "disaggregated"
	// routeLocal: disaggregated serving, but the decode worker prefilled
	// it — its uncached part was short, or no prefill worker could.
	routeLocal = "local"
)

// pool is a set of workers chosen among for one purpose.
type pool struct {
	workers []*worker
	// override is the policy settings the choice uses; nil: the Router's.
	override *policy.Override
}

// poolKind says which pool of the worker set a choice is made among.
type poolKind int

const (
	servingPool poolKind = iota // the workers that serve whole requests
	prefillPool                 // the prefill workers
)

// pool returns s's pool of kind k; an aggregated set's prefill pool is
// empty.
func (s *workerSet) pool(k poolKind) *pool {
	if k == prefillPool {
		if s.prefill == nil {
			return &pool{}
		}
		return s.prefill
	}
	return s.serving
}

// pools splits workers into those that serve whole requests and the
// prefill workers (nil when there are none: the set is aggregated).
// Validate has checked the static list's roles; workers added later join
// the pool of their role.
func pools(workers []*worker) (serving, prefill *pool) {
	serving, prefill = &pool{}, &pool{}
	for _, w := range workers {
		switch w.spec.Role {
		case RolePrefill:
			prefill.workers = append(prefill.workers, w)
		default:
			serving.workers = append(serving.workers, w)
		}
	}
	if len(prefill.workers) == 0 {
		return serving, nil
	}
	leastLoaded := policy.LeastLoaded // decode workers are chosen by their load
	serving.override = &policy.Override{Policy: &leastLoaded}
	return serving, prefill
}

// roleProblems are the problems of the workers' roles: an unknown one, or
// a list that is neither aggregated nor disaggregated.
func roleProblems(ws []WorkerSpec) []string {
	var probs []string
	n := map[string]int{}
	for _, w := range ws {
		switch w.Role {
		case "", RoleAggregated:
			n[RoleAggregated]++
		case RolePrefill, RoleDecode:
			n[w.Role]++
		default:
			probs = append(probs, fmt.Sprintf("worker %q has role %q: aggregated, prefill or decode", w.URL, w.Role))
		}
	}
	agg, pre, dec := n[RoleAggregated], n[RolePrefill], n[RoleDecode]
	switch {
	case pre+dec == 0:
	case agg > 0:
		probs = append(probs, fmt.Sprintf("%d aggregated workers listed with prefill or decode ones: a list is aggregated or disaggregated", agg))
	case dec == 0:
		probs = append(probs, fmt.Sprintf("%d prefill workers but no decode worker to decode their prompts", pre))
	case pre == 0:
		probs = append(probs, fmt.Sprintf("%d decode workers but no prefill worker: list them as aggregated", dec))
	}
	return probs
}

// generateDisaggregated serves req with a prefill and a decode worker. The
// decode worker is chosen by its load (waiting in the queue while every
// one is busy); when the prompt's part it would compute — what its pool
// and the cache tiers do not hold — is at most DisaggMinUncached tokens,
// it prefills the prompt itself. Otherwise a prefill worker chosen by the
// Router's policy prefills it with do_remote_decode (max_tokens 1), and
// the decode worker is sent the kv_transfer_params it answers, which it
// loads the prompt's blocks by. A prefill worker that fails moves the
// prefill to another; with none left, the decode worker prefills.
func (r *Router) generateDisaggregated(ctx context.Context, req sched.Request, ov *policy.Override, arrived time.Time) (<-chan sched.Output, error) {
	hashes := r.cfg.Namespace.Hashes(req.Prompt)
	tiers := r.lookup(ctx, hashes)
	preq := policy.Request{Tokens: len(req.Prompt), Blocks: len(hashes), Override: ov}
	d, c, err := r.place(ctx, servingPool, preq, hashes, tiers, true)
	if err != nil {
		return nil, err
	}
	uncached, err := r.choose.Uncached(preq, c)
	if err != nil {
		d.Seq.Done()
		r.released()
		return nil, fmt.Errorf("%w: %v", sched.ErrBadRequest, err)
	}
	out := make(chan sched.Output, 16)
	if uncached <= float64(r.cfg.DisaggMinUncached) {
		d.Seq.Predict(uncached)
		go r.serve(ctx, req, ov, d, routeLocal, arrived, out)
		return out, nil
	}
	// Given the blocks, the decode worker computes the rest: at least the
	// last token, whose logits it samples the first token from.
	bt := r.cfg.Namespace.BlockTokens
	d.Seq.Predict(float64(len(req.Prompt) - (len(req.Prompt)-1)/bt*bt))
	go func() {
		route := routeDisaggregated
		if req.Transfer = r.remotePrefill(ctx, req, preq, hashes, tiers); req.Transfer == nil {
			route = routeLocal
			d.Seq.Predict(uncached)
		}
		r.serve(ctx, req, ov, d, route, arrived, out)
	}()
	return out, nil
}

// remotePrefill prefills req's prompt on a prefill worker and returns the
// kv_transfer_params it answered, or nil when no prefill worker could (none
// free or healthy, each failed, or one refused the request itself) and the
// decode worker is to prefill it.
func (r *Router) remotePrefill(ctx context.Context, req sched.Request, preq policy.Request, hashes []index.Hash, tiers []index.TierKind) *sched.KVTransferParams {
	for moves := 0; ; moves++ {
		d, _, err := r.place(ctx, prefillPool, preq, hashes, tiers, false)
		if err != nil {
			r.cfg.Logger.Info("frontend: no prefill worker, the decode worker prefills", "id", req.ID, "err", err)
			return nil
		}
		w := r.workerSet().byName[d.Worker]
		t, a := r.prefillOn(ctx, w, req)
		d.Seq.Done()
		r.released()
		switch {
		case a.err == nil:
			return t
		case ctx.Err() != nil:
			return nil
		case a.cause == "":
			r.cfg.Logger.Warn("frontend: a prefill worker refused a request, the decode worker prefills", "id", req.ID, "worker", w.name, "err", a.err)
			return nil
		}
		r.m.migrations.WithLabelValues(a.cause).Inc()
		if a.cause != causeOverloaded {
			w.down(a.cause, a.err)
		}
		if r.cfg.MaxMigrations < 0 || moves >= r.cfg.MaxMigrations {
			r.cfg.Logger.Warn("frontend: prefill workers failed, the decode worker prefills", "id", req.ID, "moves", moves, "err", a.err)
			return nil
		}
		r.cfg.Logger.Info("frontend: moving a prefill", "id", req.ID, "from", w.name, "cause", a.cause, "err", a.err)
	}
}

// prefillAnswer is the part of a prefill worker's answer the Router reads.
type prefillAnswer struct {
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params"`
}

// prefillOn runs req's prompt on the prefill worker w, not streamed, with
// do_remote_decode and max_tokens 1, and returns the kv_transfer_params it
// answers (naming the stored blocks and the node holding them), or how it
// failed.
func (r *Router) prefillOn(ctx context.Context, w *worker, req sched.Request) (*sched.KVTransferParams, attempt) {
	resp, failed := r.post(ctx, w, workerRequest{
		Model: r.cfg.WorkerModel, Prompt: req.Prompt, MaxTokens: 1,
		Temperature: req.Sampling.Temperature, Seed: int64(req.Sampling.Seed),
		KVTransferParams: &sched.KVTransferParams{DoRemoteDecode: true},
	})
	if resp == nil {
		return nil, failed
	}
	defer resp.Body.Close()
	var ans prefillAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&ans); err != nil {
		if ctx.Err() != nil {
			return nil, attempt{err: ctx.Err()}
		}
		return nil, attempt{cause: causeBroken, err: fmt.Errorf("the prefill answer from %s: %w", w.name, err)}
	}
	if t := ans.KVTransferParams; t == nil || !t.DoRemotePrefill {
		return nil, attempt{err: errors.New("the prefill answer has no kv_transfer_params for a decode worker: is it a prefill worker?")}
	}
	return ans.KVTransferParams, attempt{}
}

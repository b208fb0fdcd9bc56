// Package sim replays request traces through simulated caches to measure
// the hit rates of eviction policies and capacities, offline and
// deterministically.
//
// A Workload is a trace turned into block keys. A Spec says what cache to
// replay it through: SingleTier (one tier, one policy, one capacity) or
// MultiTier (DRAM over SSD through the node's real tier hierarchy). Run replays one workload through many specs, in
// parallel, and returns a Result per spec.
//
// The replay, for each request in file order:
//
//  1. Lookup: the hit is the number of leading blocks the cache holds,
//     stopping at the first block it does not (a block is useless without
//     its prefix). Token hits are min(hit blocks × block tokens, input
//     length), since the last block of a prompt may be partial.
//  2. Store: every block of the request, in order, is touched if held or
//     inserted if not. When an insertion needs room, the policy's victims
//     are evicted, but never a block of the request being stored; when no
//     block qualifies, the block is not inserted.
//
// Hit rates are totals over the trace: token hit rate = Σ token hits /
// Σ input lengths, block hit rate = Σ hit blocks / Σ blocks.
//
// A Workload is safe for concurrent use; everything else here is used from
// one goroutine at a time, and Run does its own parallelism.
package sim

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/kvstrata/kvstrata/index"
)

// Spec describes one cache to replay a workload through.
type Spec interface {
	fmt.Stringer
	// newCache builds an empty cache for w, or says what is wrong with the
	// spec.
	newCache(w *Workload) (cache, error)
}

// cache is a simulated cache, driven request by request by replay.
type cache interface {
	// lookup returns how many leading blocks of keys the cache holds,
	// without counting an access to any of them.
	lookup(keys []index.Key) int
	// store accesses every block of a request in order, inserting those
	// it does not hold. first is the access position of keys[0] within
	// the workload.
	store(keys []index.Key, first int)
	// finish fills in r's kind-specific fields.
	finish(r *Result)
}

// Result is what one replay measured.
type Result struct {
	Spec           Spec
	CapacityBlocks int64 // blocks the cache could hold

	Requests    int
	Blocks      int64 // block references looked up
	HitBlocks   int64 // of those, leading blocks found
	InputTokens int64
	HitTokens   int64

	Inserted int64 // blocks stored
	Evicted  int64 // blocks evicted to make room (multi-tier: dropped from the last tier holding them)
	Rejected int64 // blocks not stored: every held block was of their own request

	// Tiers has one entry per tier of a multi-tier replay, fastest first.
	Tiers []TierResult
}

// TokenHitRate returns Σ token hits / Σ input tokens (0 for no input).
func (r Result) TokenHitRate() float64 { return ratio(r.HitTokens, r.InputTokens) }

// BlockHitRate returns Σ hit blocks / Σ blocks (0 for no blocks).
func (r Result) BlockHitRate() float64 { return ratio(r.HitBlocks, r.Blocks) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Options tune Run. A nil *Options means the defaults.
type Options struct {
	// Parallel is the number of replays run at once. The default, 0, is
	// GOMAXPROCS.
	Parallel int
	// Progress, if set, is called as replays advance with the blocks
	// replayed so far and the total, over all specs; the total is
	// len(specs) × w.Blocks(). Calls are serialised, in increasing order of
	// done, and the last one has done == total when Run succeeds.
	Progress func(done, total int64)
}

// progressEvery is how many requests a replay processes between progress
// reports and cancellation checks.
const progressEvery = 128

// Run replays w through every spec and returns the results in the order of
// specs. It checks every spec before replaying any and reports all the bad
// ones at once. It stops early, returning ctx's error, when ctx is done.
func Run(ctx context.Context, w *Workload, specs []Spec, opts *Options) ([]Result, error) {
	if opts == nil {
		opts = &Options{}
	}
	caches := make([]cache, len(specs))
	var errs []error
	for i, s := range specs {
		c, err := s.newCache(w)
		errs = append(errs, err)
		caches[i] = c
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	prog := &progress{fn: opts.Progress, total: int64(len(specs)) * w.Blocks()}
	parallel := opts.Parallel
	if parallel <= 0 {
		parallel = runtime.GOMAXPROCS(0)
	}
	results := make([]Result, len(specs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(parallel, len(specs)) {
		wg.Go(func() {
			for i := range next {
				results[i] = replay(ctx, w, specs[i], caches[i], prog)
			}
		})
	}
feed:
	for i := range specs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return results, nil
}

// Replay replays w through one spec.
func Replay(ctx context.Context, w *Workload, s Spec) (Result, error) {
	rs, err := Run(ctx, w, []Spec{s}, &Options{Parallel: 1})
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// replay runs the lookup-then-store step of every request through c. When
// ctx is done it returns early with partial counts, which Run discards.
func replay(ctx context.Context, w *Workload, s Spec, c cache, prog *progress) Result {
	r := Result{Spec: s, Requests: len(w.reqs), InputTokens: w.inputTokens, Blocks: w.Blocks()}
	bt := int64(w.blockTokens)
	reported := 0
	for i, req := range w.reqs {
		if i%progressEvery == 0 && i > 0 {
			if ctx.Err() != nil {
				return r
			}
			prog.add(int64(req.first - reported))
			reported = req.first
		}
		keys := w.keys[req.first:req.end]
		hits := c.lookup(keys)
		r.HitBlocks += int64(hits)
		r.HitTokens += min(int64(hits)*bt, req.inputTokens)
		c.store(keys, req.first)
	}
	prog.add(int64(len(w.keys) - reported))
	c.finish(&r)
	return r
}

// progress serialises the reports of parallel replays.
type progress struct {
	fn    func(done, total int64)
	mu    sync.Mutex
	done  int64
	total int64
}

func (p *progress) add(n int64) {
	if p.fn == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.fn(p.done, p.total)
}

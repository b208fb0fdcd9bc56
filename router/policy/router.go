package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/kvstrata/kvstrata/index"
)

// Request is what Choose needs of a request.
type Request struct {
	// Tokens is the prompt's length in tokens.
	Tokens int
	// Blocks is the prompt's full blocks (Tokens / BlockTokens, or fewer
	// when only some are hashed); the rest of the tokens are always
	// computed.
	Blocks int
	// Override changes the Router's settings for this request; nil keeps
	// them.
	Override *Override
}

// MaxPromptBlocks is the most full blocks a Request may have: the Router
// keeps a table of recompute times of 16 bytes a block position, as long
// as the longest prompt seen.
const MaxPromptBlocks = 1 << 20

// Candidate is one worker as the caller sees it for one request.
type Candidate struct {
	// Worker names the worker; the Router tracks its load by this name.
	Worker string
	// Overlap is the prompt's prefix blocks in the worker's own pool.
	Overlap int
	// Tiers is, per cache tier (indexed by index.TierKind − 1), the
	// prompt's prefix blocks beyond Overlap that the cache holds there,
	// each block counted once, in its fastest tier (see TierCounts).
	Tiers [NumTiers]int
	// Capacity is the worker's pool in blocks; 0 means unknown, and the
	// worker is then never busy by its blocks.
	Capacity int
	// Unhealthy takes the worker out of the candidates.
	Unhealthy bool
	// Prefill is the worker's prefill profile when it differs from the
	// Router's Config.Profile (nil: the Router's); its block size must be
	// the Router's.
	Prefill *Prefill
	// Load is load the Router does not track (routed by another frontend
	// replica, say); it is added to the Router's own.
	Load Load
}

// Load is a worker's active work.
type Load struct {
	// PrefillTokens is the predicted prefill tokens of the requests not
	// yet at their first token.
	PrefillTokens float64
	// Blocks is the KV blocks the active requests' prompts added to the
	// pool: a prompt's blocks, the partial last one included, less those
	// already in the pool when it was routed (Candidate.Overlap), which it
	// shares rather than adds.
	Blocks int
	// Prefilling and Decoding count the active requests before and after
	// their first token.
	Prefilling, Decoding int
}

// Decision is the outcome of Choose.
type Decision struct {
	// Index is the chosen candidate's index, Worker its name.
	Index  int
	Worker string
	// Policy is the policy that chose.
	Policy Policy
	// Cost is the chosen worker's cost (0 for random and round-robin).
	Cost float64
	// NewTokens is the chosen worker's predicted prefill tokens after
	// credits, the load its Sequence adds until the first token.
	NewTokens float64
	// Credited is, per cache tier, the blocks' worth of recompute the
	// chosen worker's restores from that tier were credited with.
	Credited [NumTiers]float64
	// Seq is the request's active sequence on the chosen worker: call
	// FirstToken and Done on it.
	Seq *Sequence
}

// Errors Choose returns, to be checked with errors.Is.
var (
	// ErrAllBusy: every healthy candidate is busy; the request may wait
	// and try again.
	ErrAllBusy = errors.New("policy: every worker is busy")
	// ErrNoWorkers: there is no healthy candidate.
	ErrNoWorkers = errors.New("policy: no healthy worker")
	// ErrBadRequest: the request or a candidate is inconsistent.
	ErrBadRequest = errors.New("policy: bad request")
)

// Router chooses workers and tracks the sequences it routed. It is safe for
// concurrent use.
type Router struct {
	cfg Config

	mu      sync.Mutex
	rng     *rand.Rand
	rr      uint64
	prefill *Prefill
	loads   map[string]*Load
	// Scratch, reused under mu.
	costs []float64
	elig  []int
	lds   []Load // per candidate: tracked load plus Candidate.Load
}

// New returns a Router with cfg's settings (defaults filled in), or an
// error wrapping ErrBadConfig.
func New(cfg Config) (*Router, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x6b7673747261)),
		prefill: newPrefill(cfg.Profile, cfg.BlockTokens),
		loads:   make(map[string]*Load),
	}, nil
}

// Config is the Router's settings, defaults filled in.
func (r *Router) Config() Config { return r.cfg }

// Choose picks a worker among cands for req and records the request as an
// active Sequence of it. It returns an error wrapping ErrAllBusy or
// ErrNoWorkers when no candidate qualifies, ErrBadRequest or ErrBadConfig
// for bad input; an error changes nothing.
func (r *Router) Choose(req Request, cands []Candidate) (Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, err := r.cfg.knobs(req.Override)
	if err != nil {
		return Decision{}, err
	}
	if err := r.check(req, cands); err != nil {
		return Decision{}, err
	}
	r.elig = r.elig[:0]
	r.lds = r.lds[:0]
	busy := 0
	for i := range cands {
		c := &cands[i]
		r.lds = append(r.lds, r.load(c))
		if c.Unhealthy {
			continue
		}
		if busyWith(k, c.Capacity, r.lds[i]) {
			busy++
			continue
		}
		r.elig = append(r.elig, i)
	}
	if len(r.elig) == 0 {
		if busy > 0 {
			return Decision{}, fmt.Errorf("%w (%d busy of %d)", ErrAllBusy, busy, len(cands))
		}
		return Decision{}, fmt.Errorf("%w (%d candidates)", ErrNoWorkers, len(cands))
	}
	d := Decision{Policy: k.policy}
	switch k.policy {
	case Random:
		d.Index = r.elig[r.rng.IntN(len(r.elig))]
	case RoundRobin:
		d.Index = r.elig[r.rr%uint64(len(r.elig))]
		r.rr++
	default:
		d.Index = r.pick(req, cands, k)
	}
	c := &cands[d.Index]
	d.Worker = c.Worker
	d.NewTokens, d.Credited = r.newTokens(req, c, k.policy)
	if k.policy != Random && k.policy != RoundRobin {
		d.Cost = r.cost(k, r.lds[d.Index], d.NewTokens)
	}
	d.Seq = r.start(c.Worker, d.NewTokens, ceilDiv(req.Tokens, r.cfg.BlockTokens)-c.Overlap)
	return d, nil
}

func (r *Router) check(req Request, cands []Candidate) error {
	bt := r.cfg.BlockTokens
	if req.Tokens < 0 || req.Blocks < 0 || req.Blocks > req.Tokens/bt || req.Blocks > MaxPromptBlocks {
		return fmt.Errorf("%w: %d tokens in %d full blocks of %d (at most %d blocks)", ErrBadRequest, req.Tokens, req.Blocks, bt, MaxPromptBlocks)
	}
	for i := range cands {
		c := &cands[i]
		n := c.Overlap
		bad := c.Overlap < 0 || c.Capacity < 0 || c.Load.Blocks < 0 || !(c.Load.PrefillTokens >= 0) || math.IsInf(c.Load.PrefillTokens, 0)
		for _, t := range c.Tiers {
			bad = bad || t < 0
			n += t
		}
		bad = bad || c.Prefill != nil && c.Prefill.blockTokens != bt
		if bad || n > req.Blocks || n < 0 {
			return fmt.Errorf("%w: candidate %d (%q): overlap %d, tiers %v, capacity %d, load %+v for a prompt of %d blocks (or a Prefill of other than %d-token blocks)",
				ErrBadRequest, i, c.Worker, c.Overlap, c.Tiers, c.Capacity, c.Load, req.Blocks, bt)
		}
	}
	return nil
}

// load is w's load: the tracked one plus the candidate's own.
func (r *Router) load(c *Candidate) Load {
	l := c.Load
	if t := r.loads[c.Worker]; t != nil {
		l.PrefillTokens += t.PrefillTokens
		l.Blocks += t.Blocks
		l.Prefilling += t.Prefilling
		l.Decoding += t.Decoding
	}
	return l
}

func busyWith(k knobs, capacity int, l Load) bool {
	if k.busyFrac >= 0 && capacity > 0 && float64(l.Blocks) >= k.busyFrac*float64(capacity) {
		return true
	}
	return k.busyPrefill >= 0 && l.PrefillTokens >= float64(k.busyPrefill)
}

// newTokens is the prefill tokens left for candidate c after the credits
// policy p counts, and the blocks' worth credited per tier.
func (r *Router) newTokens(req Request, c *Candidate, p Policy) (float64, [NumTiers]float64) {
	var credited [NumTiers]float64
	bt := float64(r.cfg.BlockTokens)
	tail := float64(req.Tokens - req.Blocks*r.cfg.BlockTokens)
	switch p {
	case LeastLoaded, Random, RoundRobin:
		return float64(req.Tokens), credited
	case KVHBM:
		return float64(req.Tokens - c.Overlap*r.cfg.BlockTokens), credited
	}
	pf := r.prefill
	if c.Prefill != nil {
		pf = c.Prefill
	}
	pos := c.Overlap
	work := 0.0
	for t, n := range c.Tiers {
		if n == 0 {
			continue
		}
		w := float64(n)
		if ms := restoreMs(r.cfg.Tiers[t], r.cfg.BlockBytes, n); ms >= 0 {
			w = pf.work(pos, n, ms)
		}
		credited[t] = float64(n) - w
		work += w
		pos += n
	}
	return bt*(float64(req.Blocks-pos)+work) + tail, credited
}

func (r *Router) cost(k knobs, l Load, newTokens float64) float64 {
	return k.weight*(l.PrefillTokens+newTokens)/float64(r.cfg.BlockTokens) + float64(l.Blocks)
}

// pick chooses among r.elig by cost.
func (r *Router) pick(req Request, cands []Candidate, k knobs) int {
	r.costs = r.costs[:0]
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, i := range r.elig {
		nt, _ := r.newTokens(req, &cands[i], k.policy)
		c := r.cost(k, r.lds[i], nt)
		r.costs = append(r.costs, c)
		lo, hi = min(lo, c), max(hi, c)
	}
	if k.temperature > 0 && hi-lo <= tieEps(lo) {
		return r.elig[r.rng.IntN(len(r.elig))]
	}
	if k.temperature == 0 {
		// The cheapest, ties broken by TieBreak.
		eps := tieEps(lo)
		ties, first := 0, -1
		for j, c := range r.costs {
			if c-lo <= eps {
				if first < 0 {
					first = j
				}
				ties++
			}
		}
		if ties == 1 || r.cfg.TieBreak == TieLowestIndex {
			return r.elig[first]
		}
		n := r.rng.IntN(ties)
		for j, c := range r.costs {
			if c-lo <= eps {
				if n == 0 {
					return r.elig[j]
				}
				n--
			}
		}
	}
	// Softmax over −cost, relative to the spread.
	scale := k.temperature * (hi - lo)
	var sum float64
	for j, c := range r.costs {
		w := math.Exp(-(c - lo) / scale)
		r.costs[j] = w
		sum += w
	}
	x := r.rng.Float64() * sum
	for j, w := range r.costs {
		x -= w
		if x < 0 {
			return r.elig[j]
		}
	}
	return r.elig[len(r.elig)-1]
}

// tieEps is how close to the cheapest cost lo a cost ties with it.
func tieEps(lo float64) float64 { return 1e-9 * max(1, math.Abs(lo)) }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// TierCounts turns the fastest tier of each of a prompt's blocks, as a
// cache Lookup reports them (0 for a block the cache does not hold), into
// Candidate.Tiers for a worker holding the first overlap blocks in its
// pool: the blocks from overlap on, up to the first one the cache lacks.
func TierCounts(tiers []index.TierKind, overlap int) [NumTiers]int {
	var n [NumTiers]int
	for i := max(overlap, 0); i < len(tiers); i++ {
		t := tiers[i]
		if t < index.TierHBM || t > index.TierS3 {
			break
		}
		n[t-1]++
	}
	return n
}

package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// Policies lists the policies a SingleTier may name: the online ones of
// package policy, then "belady", the offline optimum, which a replay feeds
// from a pre-pass over the trace.
var Policies = append(slices.Clone(policy.Names), "belady")

// SingleTier is one tier that holds CapacityTokens tokens' worth of whole
// blocks and evicts by one policy.
type SingleTier struct {
	Policy         string // one of Policies
	CapacityTokens int64  // > 0; the tier holds floor(CapacityTokens / block tokens) blocks
}

var _ Spec = SingleTier{}

func (s SingleTier) String() string { return fmt.Sprintf("%s@%d", s.Policy, s.CapacityTokens) }

// CapacityBlocks returns how many blocks of blockTokens tokens the tier
// holds.
func (s SingleTier) CapacityBlocks(blockTokens int) int64 {
	return s.CapacityTokens / int64(blockTokens)
}

// Validate reports every problem with s for blocks of blockTokens tokens.
func (s SingleTier) Validate(blockTokens int) error {
	var probs []string
	if !slices.Contains(Policies, s.Policy) {
		probs = append(probs, fmt.Sprintf("unknown policy %q (want one of %s)", s.Policy, strings.Join(Policies, ", ")))
	}
	switch {
	case s.CapacityTokens <= 0:
		probs = append(probs, fmt.Sprintf("capacity is %d tokens, must be > 0", s.CapacityTokens))
	case blockTokens > 0 && s.CapacityBlocks(blockTokens) == 0:
		probs = append(probs, fmt.Sprintf("capacity of %d tokens holds no block of %d tokens", s.CapacityTokens, blockTokens))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("sim: %s: %s", s, strings.Join(probs, "; "))
}

func (s SingleTier) newCache(w *Workload) (cache, error) {
	if err := s.Validate(w.blockTokens); err != nil {
		return nil, err
	}
	c := &singleTier{
		capacity:    s.CapacityBlocks(w.blockTokens),
		blockTokens: int64(w.blockTokens),
		held:        make(map[index.Key]uint32),
	}
	if s.Policy == "belady" {
		c.oracle = w.nextUses()
		c.policy = policy.NewBelady(c.oracle)
	} else {
		p, err := policy.New(s.Policy)
		if err != nil {
			return nil, fmt.Errorf("sim: %s: %w", s, err)
		}
		c.policy = p
	}
	c.skip = func(k index.Key) bool { return c.held[k] == c.req }
	return c, nil
}

// singleTier is the cache of a SingleTier replay: the set of blocks it
// holds (what a tier's own index knows) and the policy that orders them.
type singleTier struct {
	policy      policy.Policy
	oracle      *policy.SequenceOracle // Belady's, else nil
	capacity    int64                  // blocks
	blockTokens int64
	// held maps each block held to the number of the last request that
	// used it; blocks of the request being stored carry its number, which
	// is how skip keeps them from being evicted to make room for it.
	held map[index.Key]uint32
	req  uint32 // the request being stored, counted from 1
	skip func(index.Key) bool

	inserted, evicted, rejected int64
}

func (c *singleTier) lookup(keys []index.Key) int {
	for i, k := range keys {
		if _, ok := c.held[k]; !ok {
			return i
		}
	}
	return len(keys)
}

func (c *singleTier) store(keys []index.Key, first int) {
	c.req++
	// Every block of the request is protected from the start, including
	// held blocks further along than the one being inserted.
	for _, k := range keys {
		if _, ok := c.held[k]; ok {
			c.held[k] = c.req
		}
	}
	for i, k := range keys {
		if c.oracle != nil {
			c.oracle.Seek(first + i)
		}
		if _, ok := c.held[k]; ok {
			c.policy.Touch(k)
			continue
		}
		if int64(len(c.held)) >= c.capacity {
			v, ok := c.policy.Victim(c.skip)
			if !ok {
				// Every held block belongs to this request: the block is
				// not stored.
				c.rejected++
				continue
			}
			c.policy.Remove(v)
			delete(c.held, v)
			c.evicted++
		}
		e := policy.Entry{Key: k, Size: c.blockTokens}
		if i > 0 {
			e.Parent, e.HasParent = keys[i-1].Hash, true
		}
		c.policy.Add(e)
		c.held[k] = c.req
		c.inserted++
	}
}

func (c *singleTier) finish(r *Result) {
	r.CapacityBlocks = c.capacity
	r.Inserted, r.Evicted, r.Rejected = c.inserted, c.evicted, c.rejected
}

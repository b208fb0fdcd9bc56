package kvconn

import (
	"sync"

	"github.com/kvstrata/kvstrata/index"
)

// maxHints bounds the blocks tierHints remembers; past it, it forgets
// them all and starts again.
const maxHints = 1 << 16

// tierHints remembers, for the blocks of recent lookups, the fastest tier
// the node said holds them, so that Load can name the tier of a block the
// data plane delivered without saying where it came from. A hint may be
// missing or out of date (the block moved since); it only labels metrics.
type tierHints struct {
	mu sync.Mutex
	m  map[index.Key]string
}

// tierRun is one entry of a lookup's answer: tier holds the first blocks
// leading blocks of the chain.
type tierRun struct {
	tier   string
	blocks int
}

// learn records what a lookup of hashes answered: block i's hint is the
// fastest tier among the runs that hold it.
func (h *tierHints) learn(ns index.NamespaceID, hashes []index.Hash, runs []tierRun) {
	if len(runs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m)+len(hashes) > maxHints {
		h.m = map[index.Key]string{}
	}
	for i, hash := range hashes {
		best, bestKind := "", index.TierKind(0)
		for _, r := range runs {
			kind, err := index.ParseTierKind(r.tier)
			if r.blocks > i && err == nil && (best == "" || kind < bestKind) {
				best, bestKind = r.tier, kind
			}
		}
		if best == "" {
			break
		}
		h.m[index.Key{NS: ns, Hash: hash}] = best
	}
}

// tier returns key's hint, or "".
func (h *tierHints) tier(key index.Key) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.m[key]
}

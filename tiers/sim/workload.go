package sim

import (
	"fmt"
	"sync"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// Namespace is the namespace of every block key a Workload makes from a
// trace's hash ids ("mooncake" in ASCII). Trace ids are opaque block names,
// not hashes of token ids, so one fixed namespace serves every trace.
const Namespace index.NamespaceID = 0x6d6f6f6e63616b65

// DefaultBlockTokens is the block size of the Mooncake traces.
const DefaultBlockTokens = 512

// Workload is a trace turned into block keys once, ready to be replayed
// through any number of caches. It is read-only after NewWorkload, so
// parallel replays share one.
type Workload struct {
	blockTokens int
	reqs        []request
	// keys holds every block reference of the trace in access order: the
	// blocks of request 0, then those of request 1, and so on. A block's
	// position here is its access position for Belady's oracle.
	keys        []index.Key
	inputTokens int64
	distinct    int

	oracleOnce sync.Once
	oracle     *policy.SequenceOracle // built on first use; see nextUses
}

// request is one request of a Workload: its blocks are keys[first:end].
type request struct {
	first, end  int
	inputTokens int64
}

// NewWorkload prepares reqs for replay with blocks of blockTokens tokens.
// Hash id h becomes the key {Namespace, h}; each block's parent is the block
// before it in the same request, and the first block has none. The trace's
// block count is not checked against its input lengths (see package trace).
func NewWorkload(reqs []trace.Request, blockTokens int) (*Workload, error) {
	if blockTokens < 1 {
		return nil, fmt.Errorf("sim: block tokens is %d, must be ≥ 1", blockTokens)
	}
	w := &Workload{blockTokens: blockTokens, reqs: make([]request, len(reqs))}
	n := 0
	for _, r := range reqs {
		n += len(r.HashIDs)
	}
	w.keys = make([]index.Key, 0, n)
	seen := make(map[index.Key]struct{}, n/2)
	for i, r := range reqs {
		first := len(w.keys)
		for _, id := range r.HashIDs {
			k := index.Key{NS: Namespace, Hash: index.Hash(id)}
			w.keys = append(w.keys, k)
			seen[k] = struct{}{}
		}
		w.reqs[i] = request{first: first, end: len(w.keys), inputTokens: r.InputLength}
		w.inputTokens += r.InputLength
	}
	w.distinct = len(seen)
	return w, nil
}

// BlockTokens returns the tokens a block holds.
func (w *Workload) BlockTokens() int { return w.blockTokens }

// Requests returns the number of requests.
func (w *Workload) Requests() int { return len(w.reqs) }

// Blocks returns the number of block references, over all requests.
func (w *Workload) Blocks() int64 { return int64(len(w.keys)) }

// DistinctBlocks returns the number of different blocks referenced: the
// capacity, in blocks, above which no replay evicts anything.
func (w *Workload) DistinctBlocks() int { return w.distinct }

// InputTokens returns the sum of the requests' input lengths.
func (w *Workload) InputTokens() int64 { return w.inputTokens }

// nextUses returns an oracle over the workload's access sequence with its
// own cursor. The pre-pass that finds every access's next use runs once,
// on the first call, and its tables are shared by all later calls.
func (w *Workload) nextUses() *policy.SequenceOracle {
	w.oracleOnce.Do(func() { w.oracle = policy.NewSequenceOracle(w.keys) })
	return w.oracle.Clone()
}

// ReadWorkload reads a Mooncake JSONL trace file (trace.ReadFile) and
// prepares it for replay with blocks of blockTokens tokens (NewWorkload).
func ReadWorkload(path string, blockTokens int) (*Workload, error) {
	reqs, err := trace.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return NewWorkload(reqs, blockTokens)
}

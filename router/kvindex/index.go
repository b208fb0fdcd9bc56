package kvindex

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/index"
)

// WorkerID names a worker; the caller chooses it.
type WorkerID uint32

// Errors callers can test with errors.Is.
var (
	// ErrUnknownWorker: the worker is not registered.
	ErrUnknownWorker = errors.New("kvindex: unknown worker")
	// ErrWorkerExists: Register of a worker already registered.
	ErrWorkerExists = errors.New("kvindex: worker already registered")
)

// Config configures an Index. A nil *Config means the defaults.
type Config struct {
	// MaxEntries caps the (block, worker) entries each namespace holds;
	// past it the least recently stored or queried blocks are pruned (see
	// the package doc). The default is 8 M entries.
	MaxEntries int
}

// DefaultMaxEntries is Config.MaxEntries' default.
const DefaultMaxEntries = 8 << 20

// EnsureDefaults fills zero fields with their documented defaults.
func (c *Config) EnsureDefaults() {
	if c.MaxEntries == 0 {
		c.MaxEntries = DefaultMaxEntries
	}
}

// Validate reports what is wrong with c.
func (c *Config) Validate() error {
	if c.MaxEntries < 16 {
		return fmt.Errorf("kvindex: MaxEntries: %d, want at least 16", c.MaxEntries)
	}
	return nil
}

// Stats counts what an Index holds and what it refused.
type Stats struct {
	Workers int    // registered
	Blocks  int    // distinct blocks indexed, over all namespaces
	Entries int    // (block, worker) entries indexed
	Orphans uint64 // blocks skipped: their parent was not indexed for the worker
	Refused uint64 // BlockStored events refused (block size, tokens, LoRA)
	// OtherMedium counts events of a medium other than the GPU, ignored.
	OtherMedium uint64
	Pruned      uint64 // entries dropped to keep under MaxEntries
}

// Match is one worker's overlap with a chain: it holds the chain's first
// Blocks blocks.
type Match struct {
	Worker WorkerID
	Blocks int
}

// Index is the router's index of the blocks in the workers' GPU pools. See
// the package doc.
type Index struct {
	cfg Config

	regMu sync.Mutex // serializes changes of reg
	reg   atomic.Pointer[registry]

	orphans, refused, otherMedium, pruned atomic.Uint64
}

// registry is an immutable snapshot of the workers and their namespaces.
type registry struct {
	workers map[WorkerID]*worker
	spaces  map[index.NamespaceID]*space
}

// New returns an empty Index.
func New(cfg *Config) (*Index, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	x := &Index{cfg: c}
	x.reg.Store(&registry{workers: map[WorkerID]*worker{}, spaces: map[index.NamespaceID]*space{}})
	return x, nil
}

// Register adds worker w, whose pool holds blocks of namespace ns.
func (x *Index) Register(w WorkerID, ns index.Namespace) error {
	if err := ns.Validate(); err != nil {
		return fmt.Errorf("kvindex: register worker %d: %w", w, err)
	}
	x.regMu.Lock()
	defer x.regMu.Unlock()
	old := x.reg.Load()
	if _, ok := old.workers[w]; ok {
		return fmt.Errorf("%w: %d", ErrWorkerExists, w)
	}
	next := &registry{workers: maps.Clone(old.workers), spaces: maps.Clone(old.spaces)}
	sp, ok := next.spaces[ns.ID()]
	if !ok {
		sp = newSpace(x, ns)
		next.spaces[ns.ID()] = sp
	}
	next.workers[w] = sp.addWorker(w)
	x.reg.Store(next)
	return nil
}

// RemoveWorker forgets worker w and every block it held.
func (x *Index) RemoveWorker(w WorkerID) error {
	x.regMu.Lock()
	defer x.regMu.Unlock()
	old := x.reg.Load()
	wk, ok := old.workers[w]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownWorker, w)
	}
	next := &registry{workers: maps.Clone(old.workers), spaces: old.spaces}
	delete(next.workers, w)
	x.reg.Store(next)
	wk.sp.removeWorker(wk)
	return nil
}

// ClearWorker forgets every block worker w held, as for AllBlocksCleared;
// the frontend calls it when the worker's event stream reset or lost
// batches.
func (x *Index) ClearWorker(w WorkerID) error {
	wk, ok := x.reg.Load().workers[w]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownWorker, w)
	}
	wk.sp.mu.Lock()
	defer wk.sp.mu.Unlock()
	if !wk.gone {
		wk.sp.clearWorker(wk)
	}
	return nil
}

// Apply applies a batch of worker w's events, in order. Events it cannot
// use are counted (Stats), not reported: only an unknown worker is an
// error.
func (x *Index) Apply(w WorkerID, b *kvevents.Batch) error {
	wk, ok := x.reg.Load().workers[w]
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownWorker, w)
	}
	sp := wk.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if wk.gone { // removed since the snapshot was read
		return fmt.Errorf("%w: %d", ErrUnknownWorker, w)
	}
	for _, e := range b.Events {
		switch e := e.(type) {
		case *kvevents.BlockStored:
			sp.store(wk, e)
		case *kvevents.BlockRemoved:
			if !gpu(e.Medium) {
				x.otherMedium.Add(1)
				continue
			}
			for _, h := range e.BlockHashes {
				sp.remove(wk, engineKey(h))
			}
		case *kvevents.AllBlocksCleared:
			sp.clearWorker(wk)
		}
	}
	wk.sweep()
	return nil
}

// Overlap returns, appended to dst, each worker of namespace ns that holds
// at least the first block of hashes (a request's chain, in order) with the
// length of the longest prefix of the chain it holds. Workers are in no
// particular order; one that holds no prefix is not listed.
func (x *Index) Overlap(ns index.NamespaceID, hashes []index.Hash, dst []Match) []Match {
	sp, ok := x.reg.Load().spaces[ns]
	if !ok || len(hashes) == 0 {
		return dst
	}
	return sp.overlap(hashes, dst)
}

// Stats returns the index's counters.
func (x *Index) Stats() Stats {
	r := x.reg.Load()
	s := Stats{
		Workers:     len(r.workers),
		Orphans:     x.orphans.Load(),
		Refused:     x.refused.Load(),
		OtherMedium: x.otherMedium.Load(),
		Pruned:      x.pruned.Load(),
	}
	for _, sp := range r.spaces {
		sp.mu.RLock()
		s.Blocks += sp.tab.n
		s.Entries += sp.entries
		sp.mu.RUnlock()
	}
	return s
}

// gpu reports whether medium names the GPU pool (nil: not said, as vLLM
// before it had the field, whose events were all of the GPU).
func gpu(medium *string) bool { return medium == nil || *medium == kvevents.MediumGPU }

// engineKey is an engine's block hash as 64 bits: an integer's two's
// complement, a byte string's last 8 bytes big-endian.
func engineKey(h kvevents.Hash) uint64 {
	if h.IsBytes() {
		var k uint64
		b := h.Bytes()
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		for _, c := range b {
			k = k<<8 | uint64(c)
		}
		return k
	}
	if v, ok := h.Uint64(); ok {
		return v
	}
	v, _ := h.Int64()
	return uint64(v)
}

// forEachBit calls fn with the index of each bit set in word k of a bitmap.
func forEachBit(k int, word uint64, fn func(bit int)) {
	for word != 0 {
		fn(k*64 + bits.TrailingZeros64(word))
		word &= word - 1
	}
}

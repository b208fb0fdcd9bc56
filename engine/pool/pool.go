// Package pool is a worker's GPU ("HBM") KV block pool with prefix caching,
// as vLLM's v1 BlockPool and KVCacheManager keep it.
//
// The pool has a fixed number of blocks, each holding the KV of BlockTokens
// tokens. A request holds its blocks through reference counts: Find takes the
// longest cached prefix of its block hashes (sharing those blocks with other
// requests), Allocate takes fresh blocks for the rest, Cache names each block
// that has become full by its chained hash, and Free gives them back. A freed
// block whose count falls to zero joins the free queue, most recently freed
// last, and keeps its hash: a later request still finds it there until
// Allocate reuses it, which takes the queue's least recently freed block
// first and evicts that block's hash. Blocks are named by index's chained
// hash (index.ChainHash) within a namespace, so the router, the cache and
// the pool agree on names.
//
// Every hash that becomes cached (BlockStored), every cached hash evicted
// (BlockRemoved) and every Reset (AllBlocksCleared) is reported, in order, to
// the listener given in Config, from inside the call that caused it.
//
// A Pool is not safe for concurrent use: the engine loop owns it. Every
// operation but Reset costs O(1) per block it is given or returns.
package pool

import (
	"errors"
	"fmt"

	"github.com/kvstrata/kvstrata/index"
)

// BlockID is a block's position in the pool, 0 ≤ id < Config.Blocks; it
// names where the block's KV lives on the device.
type BlockID int32

// Errors callers can test with errors.Is.
var (
	// ErrNoSpace: fewer blocks are free than asked for; nothing changed.
	ErrNoSpace = errors.New("pool: not enough free blocks")
	// ErrInUse: Reset while some request still holds blocks; nothing changed.
	ErrInUse = errors.New("pool: blocks in use")
	// ErrBadBlock: a block id out of range, or a block table the call
	// cannot take (a block not held, freed more often than held, fewer
	// blocks than the tokens fill); nothing changed.
	ErrBadBlock = errors.New("pool: bad block")
)

// Config sizes a pool.
type Config struct {
	// Blocks is the number of blocks in the pool. Required (at least 1).
	Blocks int
	// BlockTokens is the number of tokens a block holds. The default value
	// is 16, vLLM's default block size.
	BlockTokens int
	// Listener, if not nil, is told of every cache change, in order, from
	// inside the call that makes it. It must not call the pool, and it owns
	// the Event's slices.
	Listener func(Event)
}

// EnsureDefaults fills the zero fields that have a default.
func (c *Config) EnsureDefaults() {
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
}

// Validate reports every field that is wrong.
func (c *Config) Validate() error {
	var errs []error
	if c.Blocks < 1 || c.Blocks > 1<<31-2 {
		errs = append(errs, fmt.Errorf("pool: Blocks is %d, want 1 to %d", c.Blocks, 1<<31-2))
	}
	if c.BlockTokens < 1 {
		errs = append(errs, fmt.Errorf("pool: BlockTokens is %d, want at least 1", c.BlockTokens))
	}
	return errors.Join(errs...)
}

// Stats are the pool's occupancy and its prefix-cache counters, named after
// vLLM's metrics.
type Stats struct {
	Blocks int // in the pool
	Free   int // on the free queue, cached or not
	Cached int // blocks findable by hash, in use or free

	// Usage is the fraction of blocks held by requests, 1 - Free/Blocks
	// (vLLM's kv_cache_usage_perc).
	Usage float64

	// Prefix-cache counters since New, counted by Find: Queries and Hits in
	// tokens (vLLM's prefix_cache_queries and prefix_cache_hits), and the
	// same in blocks; Requests is the number of Find calls.
	Requests      uint64
	QueriedTokens uint64
	HitTokens     uint64
	QueriedBlocks uint64
	HitBlocks     uint64
	// Evictions counts cached hashes dropped because their block was reused.
	Evictions uint64
}

// none marks the end of the free queue and a block not on it.
const none = -1

type block struct {
	ref    int32
	hashed bool      // key names the KV the block holds
	key    index.Key // valid when hashed
	queued bool      // on the free queue, which is exactly when ref is 0
	// prev and next link the free queue (none at its ends).
	prev, next int32
}

// Pool is a fixed-size block pool with prefix caching. See the package
// comment.
type Pool struct {
	cfg    Config
	blocks []block
	// cached maps a hash to the one block registered under it. A block
	// that is hashed but not registered holds a copy computed while
	// another block already held the hash; it is never found.
	cached map[index.Key]int32
	// The free queue: head is the least recently freed block (reused
	// first), tail the most recently freed.
	head, tail int32
	free       int
	stats      Stats
}

// New returns a pool of cfg.Blocks free, uncached blocks.
func New(cfg Config) (*Pool, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:    cfg,
		blocks: make([]block, cfg.Blocks),
		cached: make(map[index.Key]int32),
		head:   none,
		tail:   none,
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = none, none
		p.pushTail(int32(i))
	}
	return p, nil
}

// BlockTokens returns the number of tokens a block holds.
func (p *Pool) BlockTokens() int { return p.cfg.BlockTokens }

// NumFree returns the number of blocks Allocate can take now.
func (p *Pool) NumFree() int { return p.free }

// Usage returns the fraction of blocks held by requests.
func (p *Pool) Usage() float64 {
	return float64(len(p.blocks)-p.free) / float64(len(p.blocks))
}

// Stats returns the pool's occupancy and counters.
func (p *Pool) Stats() Stats {
	s := p.stats
	s.Blocks, s.Free, s.Cached, s.Usage = len(p.blocks), p.free, len(p.cached), p.Usage()
	return s
}

// Match returns how many of hashes, a sequence's chained block hashes in
// order, are cached as a prefix. It changes nothing and counts nothing: a
// scheduler asks it to size an admission before it commits with Find.
func (p *Pool) Match(ns index.NamespaceID, hashes []index.Hash) int {
	for i, h := range hashes {
		if _, ok := p.cached[index.Key{NS: ns, Hash: h}]; !ok {
			return i
		}
	}
	return len(hashes)
}

// Find returns the blocks of the longest cached prefix of hashes, a
// sequence's chained block hashes in order, and takes a reference on each
// for the caller (a free one leaves the free queue); the caller gives them
// back with Free. tokens is the request's length in tokens, counted as
// queried tokens as vLLM counts prefix_cache_queries. A caller that must
// compute at least the last token (for its logits) leaves that token's
// block out of hashes.
func (p *Pool) Find(ns index.NamespaceID, hashes []index.Hash, tokens int) []BlockID {
	n := p.Match(ns, hashes)
	p.stats.Requests++
	p.stats.QueriedTokens += uint64(max(tokens, 0))
	p.stats.QueriedBlocks += uint64(len(hashes))
	p.stats.HitBlocks += uint64(n)
	p.stats.HitTokens += uint64(n * p.cfg.BlockTokens)
	if n == 0 {
		return nil
	}
	out := make([]BlockID, n)
	for i, h := range hashes[:n] {
		id := p.cached[index.Key{NS: ns, Hash: h}]
		if p.blocks[id].ref == 0 {
			p.unlink(id)
		}
		p.blocks[id].ref++
		out[i] = BlockID(id)
	}
	return out
}

// Allocate takes n blocks for a request from the free queue, least
// recently freed first, each with a reference count of one and no hash: a
// reused block that was cached is evicted (BlockRemoved). With fewer than n
// blocks free it returns an error wrapping ErrNoSpace and changes nothing.
func (p *Pool) Allocate(n int) ([]BlockID, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: allocate %d blocks", ErrBadBlock, n)
	}
	if n > p.free {
		return nil, fmt.Errorf("%w: want %d, %d of %d free", ErrNoSpace, n, p.free, len(p.blocks))
	}
	out := make([]BlockID, n)
	for i := range out {
		id := p.head
		p.unlink(id)
		p.evict(id)
		p.blocks[id].ref = 1
		out[i] = BlockID(id)
	}
	return out, nil
}

// Cache names the blocks of a sequence that have become full. blocks is the
// sequence's block table in order and tokens its tokens so far; the first
// len(tokens)/BlockTokens blocks are full. The full blocks after the last
// one findable by its hash get their chained hashes,
//
//	h[i] = index.ChainHash(h[i-1], tokens of block i), h[-1] = ns,
//
// become findable, and are reported as BlockStored, one event per run of
// consecutive new hashes with the hash before the run as its parent (so a
// parent is always cached when its child is stored). A hash that another
// block already holds is not stored twice: that block stays unfindable and
// no event is sent for it; should the other block be evicted while this
// one is the last of the sequence's findable prefix, the next Cache stores
// it again. Cache returns the hashes of the blocks it named, in order (nil
// if none). It checks everything before it changes anything: the blocks
// it names and the one before them must be held, that one of namespace ns.
func (p *Pool) Cache(ns index.NamespaceID, blocks []BlockID, tokens []uint32) ([]index.Hash, error) {
	bt := p.cfg.BlockTokens
	full := len(tokens) / bt
	if full > len(blocks) {
		return nil, fmt.Errorf("%w: %d tokens fill %d blocks, the table has %d", ErrBadBlock, len(tokens), full, len(blocks))
	}
	// The findable blocks are a prefix of the table, but for copies (see
	// above): walk back from the last full block to the last findable one,
	// checking the blocks on the way, and no others: a decode step costs
	// O(1), not the length of the sequence.
	from := full
	for ; from > 0; from-- {
		id := blocks[from-1]
		if id < 0 || int(id) >= len(p.blocks) || p.blocks[id].ref == 0 {
			return nil, fmt.Errorf("%w: block %d is not held", ErrBadBlock, id)
		}
		if b := &p.blocks[id]; b.hashed {
			if _, ok := p.cached[b.key]; ok {
				break
			}
		}
	}
	if from == full {
		return nil, nil
	}
	prev := uint64(ns)
	if from > 0 {
		b := &p.blocks[blocks[from-1]]
		if b.key.NS != ns {
			return nil, fmt.Errorf("%w: block %d is of namespace %v, not %v", ErrBadBlock, blocks[from-1], b.key.NS, ns)
		}
		prev = uint64(b.key.Hash)
	}
	out := make([]index.Hash, 0, full-from)
	run := -1 // first block of the current run of new hashes
	flush := func(end int) {
		if run < 0 || p.cfg.Listener == nil {
			run = -1
			return
		}
		e := Event{
			Kind:        BlockStored,
			NS:          ns,
			Hashes:      append([]index.Hash(nil), out[run-from:end-from]...),
			Tokens:      append([]uint32(nil), tokens[run*bt:end*bt]...),
			BlockTokens: bt,
		}
		if run > 0 {
			e.Parent, e.HasParent = p.blocks[blocks[run-1]].key.Hash, true
		}
		p.cfg.Listener(e)
		run = -1
	}
	for i := from; i < full; i++ {
		h := index.ChainHash(prev, tokens[i*bt:(i+1)*bt])
		prev = uint64(h)
		out = append(out, h)
		k := index.Key{NS: ns, Hash: h}
		b := &p.blocks[blocks[i]]
		b.hashed, b.key = true, k
		if _, dup := p.cached[k]; dup {
			flush(i)
			continue
		}
		p.cached[k] = int32(blocks[i])
		if run < 0 {
			run = i
		}
	}
	flush(full)
	return out, nil
}

// Free gives back a request's references to blocks, its block table in
// order. A block whose count falls to zero joins the free queue; the table
// is queued last block first, so that a prefix's tail is reused before its
// head, which more requests share. A cached block keeps its hash until
// Allocate reuses it. It checks every block before it changes anything.
func (p *Pool) Free(blocks []BlockID) error {
	for _, id := range blocks {
		if id < 0 || int(id) >= len(p.blocks) {
			return fmt.Errorf("%w: block %d is not in the pool of %d", ErrBadBlock, id, len(p.blocks))
		}
	}
	for i, id := range blocks {
		if p.blocks[id].ref == 0 {
			for _, done := range blocks[:i] {
				p.blocks[done].ref++
			}
			return fmt.Errorf("%w: block %d is freed more often than it is held", ErrBadBlock, id)
		}
		p.blocks[id].ref--
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		id := int32(blocks[i])
		b := &p.blocks[id]
		if b.ref == 0 && !b.queued {
			if reg, ok := p.cached[b.key]; b.hashed && (!ok || reg != id) {
				b.hashed = false // an unfindable copy holds nothing worth keeping
			}
			p.pushTail(id)
		}
	}
	return nil
}

// Reset drops every cached hash (AllBlocksCleared), as vLLM's
// reset_prefix_cache does; as there, it fails with ErrInUse, changing
// nothing, while any request holds blocks.
func (p *Pool) Reset() error {
	if p.free != len(p.blocks) {
		return fmt.Errorf("%w: %d of %d blocks held", ErrInUse, len(p.blocks)-p.free, len(p.blocks))
	}
	clear(p.cached)
	for i := range p.blocks {
		p.blocks[i].hashed, p.blocks[i].key = false, index.Key{}
	}
	if p.cfg.Listener != nil {
		p.cfg.Listener(Event{Kind: AllBlocksCleared})
	}
	return nil
}

// evict drops the hash of block id, about to be reused.
func (p *Pool) evict(id int32) {
	b := &p.blocks[id]
	if !b.hashed {
		return
	}
	k := b.key
	b.hashed, b.key = false, index.Key{}
	if reg, ok := p.cached[k]; !ok || reg != id {
		return
	}
	delete(p.cached, k)
	p.stats.Evictions++
	if p.cfg.Listener != nil {
		p.cfg.Listener(Event{Kind: BlockRemoved, NS: k.NS, Hashes: []index.Hash{k.Hash}})
	}
}

func (p *Pool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.queued = p.tail, none, true
	if p.tail == none {
		p.head = id
	} else {
		p.blocks[p.tail].next = id
	}
	p.tail = id
	p.free++
}

func (p *Pool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev == none {
		p.head = b.next
	} else {
		p.blocks[b.prev].next = b.next
	}
	if b.next == none {
		p.tail = b.prev
	} else {
		p.blocks[b.next].prev = b.prev
	}
	b.prev, b.next, b.queued = none, none, false
	p.free--
}

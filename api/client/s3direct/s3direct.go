// Package s3direct restores long contexts straight from the object store
// that cache nodes' S3 tier writes to, instead of through a node.
//
// A context that was evicted down to the object store comes back through
// its node at the pace of two transfers — store to node, node to engine —
// on the node's CPU. An engine that holds credentials for the bucket can
// skip the node's hop: a Reader asks the node where each block is
// (Client.LocateObjects), reads the blocks whose fastest copy is in the
// store with large ranged GETs of the segment objects that hold them
// (adjacent blocks together, a few requests in flight), reads the others
// from the node's data plane, checks every block's checksum, and hands the
// blocks over in order as they arrive.
//
// The store path is only a shortcut: a block whose object is gone
// (rewritten after a delete), short, or whose bytes do not match their
// checksum is fetched from the node instead, which knows what to do. Wrong
// bytes are never returned. Blocks read directly are not promoted on the
// node; warm them (Client.Warm) if the node should keep them hot.
//
// A Reader asks one node, which knows its own tiers and the shared object
// store: in a cluster, blocks held only in another node's DRAM or SSD read
// as misses here (client.ClusterClient fetches those from their node).
package s3direct

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/minio/minio-go/v7"
	"google.golang.org/grpc/codes"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
)

// Config tunes a Reader; zero fields take their defaults.
type Config struct {
	// Concurrency is how many reads — ranged GETs of the store and gets
	// from the node — are in flight at once, ahead of the block being
	// handed over. The default is 4.
	Concurrency int
	// MaxRange is the most bytes one ranged GET reads; adjacent blocks of
	// one object are read together up to it. The first reads of a Get are
	// smaller (1, 2, 4, … blocks) so that the first block arrives soon.
	// The default is 64 MiB.
	MaxRange int64
}

// Defaults of Config.
const (
	DefaultConcurrency = 4
	DefaultMaxRange    = 64 << 20
)

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxRange == 0 {
		c.MaxRange = DefaultMaxRange
	}
}

// ErrInvalidConfig marks a Config that fails Validate.
var ErrInvalidConfig = errors.New("s3direct: invalid config")

// Validate reports every problem with c, naming the fields. Call it after
// EnsureDefaults (New does both).
func (c *Config) Validate() error {
	var probs []string
	if c.Concurrency <= 0 {
		probs = append(probs, fmt.Sprintf("Concurrency is %d, must be positive", c.Concurrency))
	}
	if c.MaxRange <= 0 {
		probs = append(probs, fmt.Sprintf("MaxRange is %d, must be positive", c.MaxRange))
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
	}
	return nil
}

// Counts says where a Reader's blocks came from.
type Counts struct {
	Direct int64 // read from the store by the Reader
	Node   int64 // read through the node (not in the store, or a fallback)
	// Fallbacks counts store reads that failed (gone, short, corrupt, the
	// store unreachable) and were read through the node instead.
	Fallbacks int64
}

// A Reader restores blocks from a node and the object store behind it. It
// is safe for concurrent use.
type Reader struct {
	node  *client.Client
	store minio.Core
	cfg   Config

	direct, viaNode, fallbacks atomic.Int64
}

// New returns a Reader that locates blocks through node and reads the
// object store with store, a minio-go client for the same endpoint the
// node's S3 tier uses, with credentials that may read its bucket.
func New(node *client.Client, store *minio.Client, cfg Config) (*Reader, error) {
	if node == nil || store == nil {
		return nil, errors.New("s3direct: a node client and a store client are both required")
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Reader{node: node, store: minio.Core{Client: store}, cfg: cfg}, nil
}

// Counts returns where the Reader's blocks have come from so far.
func (r *Reader) Counts() Counts {
	return Counts{Direct: r.direct.Load(), Node: r.viaNode.Load(), Fallbacks: r.fallbacks.Load()}
}

// Get fetches keys and calls fn for each block in order, as client.GetFunc
// does; a Result's Tier is "s3" for a block read from the store directly.
// With opts.Buffer set, Buffer is called from several goroutines, for
// blocks out of order, and again for a block whose direct read failed, so
// each block's memory must be its own until fn has returned for it (an
// engine's KV pages are). An error from fn ends the call with that error.
// No read is still writing to a buffer once Get returns.
func (r *Reader) Get(ctx context.Context, keys []index.Key, opts client.GetOptions, fn func(i int, res client.Result) error) error {
	if len(keys) == 0 {
		return nil
	}
	places, err := r.node.LocateObjects(ctx, keys)
	if ce := (*client.Error)(nil); errors.As(err, &ce) && ce.Code == codes.Unimplemented {
		return r.node.GetFunc(ctx, keys, opts, fn) // a node too old to locate: all through it
	}
	if err != nil {
		return fmt.Errorf("s3direct: %w", err)
	}
	end := len(keys) // blocks to read; with StopAtMiss, up to the first miss
	if opts.StopAtMiss {
		for i, p := range places {
			if p.Tier == "" {
				end = i
				break
			}
		}
	}
	buffer := opts.Buffer
	if buffer == nil {
		buffer = func(_, size int) []byte { return make([]byte, size) }
	}

	ctx, cancel := context.WithCancel(ctx)
	g := &get{r: r, ctx: ctx, keys: keys, places: places, buffer: buffer, slots: make([]slot, end)}
	for i := range g.slots {
		g.slots[i].done = make(chan struct{})
	}
	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel: no read outlives Get
	defer cancel()
	maxNode := int(r.node.Info().GetMaxBatchBlocks())
	pieces := plan(places[:end], r.cfg.MaxRange, max(maxNode, 1))
	inFlight := make(chan struct{}, r.cfg.Concurrency) // a piece holds one until handed over
	wg.Go(func() {
		for k, p := range pieces {
			select {
			case inFlight <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() { g.read(p) })
			if k == 0 { // the first block alone: it arrives sooner without company
				select {
				case <-g.slots[p.from].done:
				case <-ctx.Done():
					return
				}
			}
		}
	})

	for _, p := range pieces {
		for i := p.from; i < p.to; i++ {
			s := &g.slots[i]
			select {
			case <-s.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if s.err != nil {
				return fmt.Errorf("s3direct: block %d: %w", i, s.err)
			}
			res := s.res
			s.res = client.Result{}
			if err := fn(i, res); err != nil {
				return err
			}
			if !res.Found && opts.StopAtMiss {
				return nil
			}
		}
		<-inFlight
	}
	if end < len(keys) { // StopAtMiss: the first block held nowhere
		return fn(end, client.Result{})
	}
	return nil
}

// get is one Get in progress.
type get struct {
	r      *Reader
	ctx    context.Context
	keys   []index.Key
	places []client.Placement
	buffer func(i, size int) []byte
	slots  []slot
}

// slot is one block's outcome; done is closed once res or err is set.
type slot struct {
	done chan struct{}
	res  client.Result
	err  error
}

func (g *get) finish(i int, res client.Result, err error) {
	g.slots[i].res, g.slots[i].err = res, err
	close(g.slots[i].done)
}

// source says where a piece's blocks are read from.
type source uint8

const (
	fromNode source = iota
	fromStore
	heldNowhere
)

// piece is a run of blocks read with one request: keys[from:to].
type piece struct {
	src      source
	from, to int
}

// plan groups blocks into pieces: adjacent blocks of one object (one
// ranged GET, at most maxRange bytes), runs of blocks to get from the node
// (at most maxNode), runs of misses. Piece k holds at most 2^k blocks, so
// that the first blocks come back after small reads.
func plan(places []client.Placement, maxRange int64, maxNode int) []piece {
	var out []piece
	var bytes int64
	for i, p := range places {
		src := sourceOf(p)
		if n := len(out); n > 0 {
			last := &out[n-1]
			prev := places[i-1]
			fits := last.src == src && last.to-last.from < 1<<min(n-1, 20)
			switch src {
			case fromStore:
				fits = fits && p.Bucket == prev.Bucket && p.Object == prev.Object &&
					p.Offset == prev.Offset+int64(prev.Size) && bytes+int64(p.Size) <= maxRange
			case fromNode:
				fits = fits && last.to-last.from < maxNode
			}
			if fits {
				last.to++
				bytes += int64(p.Size)
				continue
			}
		}
		out = append(out, piece{src: src, from: i, to: i + 1})
		bytes = int64(p.Size)
	}
	return out
}

func sourceOf(p client.Placement) source {
	switch {
	case p.Tier == "":
		return heldNowhere
	case p.Object != "" && p.Size > 0 && p.Offset >= 0:
		return fromStore
	}
	return fromNode
}

// read reads one piece and finishes each of its blocks.
func (g *get) read(p piece) {
	switch p.src {
	case heldNowhere:
		for i := p.from; i < p.to; i++ {
			g.finish(i, client.Result{}, nil)
		}
	case fromStore:
		if i := g.readStore(p); i < p.to {
			if g.ctx.Err() == nil {
				g.r.fallbacks.Add(1)
			}
			g.readNode(i, p.to)
		}
	default:
		g.readNode(p.from, p.to)
	}
}

// readStore reads a piece with one ranged GET, checking and finishing its
// blocks as they arrive. It returns the first block it did not finish.
func (g *get) readStore(p piece) int {
	first, last := g.places[p.from], g.places[p.to-1]
	size := last.Offset + int64(last.Size) - first.Offset
	var opts minio.GetObjectOptions
	if err := opts.SetRange(first.Offset, first.Offset+size-1); err != nil {
		return p.from
	}
	body, info, _, err := g.r.store.GetObject(g.ctx, first.Bucket, first.Object, opts)
	if err != nil {
		return p.from
	}
	defer body.Close()
	if info.Size != size {
		return p.from
	}
	for i := p.from; i < p.to; i++ {
		pl := g.places[i]
		buf := g.buffer(i, pl.Size)[:pl.Size]
		if _, err := io.ReadFull(body, buf); err != nil || index.Checksum(buf) != pl.Sum {
			return i
		}
		g.r.direct.Add(1)
		g.finish(i, client.Result{Found: true, Data: buf, Sum: pl.Sum, Parent: pl.Parent,
			HasParent: pl.HasParent, Tier: index.TierS3.String()}, nil)
	}
	return p.to
}

// readNode gets keys[from:to] from the node, finishing each block.
func (g *get) readNode(from, to int) {
	next := from
	err := g.r.node.GetFunc(g.ctx, g.keys[from:to], client.GetOptions{
		Buffer: func(j, size int) []byte { return g.buffer(from+j, size) },
	}, func(j int, res client.Result) error {
		if res.Found {
			g.r.viaNode.Add(1)
		}
		g.finish(from+j, res, nil)
		next = from + j + 1
		return nil
	})
	if err == nil && next < to {
		err = fmt.Errorf("the node answered %d of %d blocks", next-from, to-from)
	}
	for i := next; i < to; i++ {
		g.finish(i, client.Result{}, err)
	}
}

// Package s3 is the object-store tier: a tiers.Tier that keeps blocks in
// an S3-compatible bucket through minio-go, shared by every node that
// points at the same bucket and prefix. It is the bottom of the
// hierarchy: SSD victims are demoted into it one Put at a time, and long
// contexts are restored from it, many ranged GETs in parallel (GetMany).
//
// # Segments
//
// One object per block would cost a PUT per block and millions of tiny
// objects, so blocks are packed into segments. A Put copies the block into
// the open segment of its namespace, in memory, and returns; the segment
// is sealed when its blocks reach Config.SegmentSize or it has been open
// for Config.FlushInterval, and uploaded by a background goroutine as one
// data object (a multipart upload over Config.PartSize) followed by a
// small index object. Until its upload ends, a segment's blocks are read
// from memory.
//
// Each namespace has its own open segment: the blocks of one sequence,
// which come down from the SSD tier together, then lie side by side in
// one segment, a segment never mixes two models' or tenants' blocks, and a
// namespace that goes cold ages out whole segments instead of leaving
// holes in shared ones. The cost is more small segments when many
// namespaces trickle blocks at once; FlushInterval bounds how long they
// wait.
//
// # Object layout
//
// Under Config.Prefix:
//
//	<prefix>/v1/seg/<segment-id>   data: the blocks' bytes back to back
//	<prefix>/v1/idx/<segment-id>   index: per block key, parent, size,
//	                               offset and xxhash64 checksum, and a
//	                               checksum of the index itself
//
// A segment id is <seal time in Unix ns, 16 hex>-<writer, 16 hex>, so
// names sort in seal order and a listing after a name lists the newer
// segments. segindex.go documents the index format. Data and index live
// under separate prefixes so that lifecycle rules can treat them apart: a
// rule that aborts incomplete multipart uploads under seg/ after a day is
// recommended; an age-based expiry, if any, should cover seg/ and idx/
// alike (the tier copes with either disappearing first: a block whose
// data object is gone reads as missing).
//
// The data object is written first, then the index: a segment is visible
// to other nodes only once it is whole. A crash between the two leaves a
// data object no index names; the tier never reads such garbage, and
// after a full rescan deletes it once the store says it was written more
// than Config.GarbageAge ago (younger, it may be another node's upload
// whose index is still on its way).
//
// # Reads
//
// Get reads one block with a ranged GET of exactly its bytes and checks
// them against the index's checksum. Bytes that fail are never returned:
// the block is dropped from the map, queued for removal from its index,
// counted (S3Stats.CorruptBlocks), and Get fails with tiers.ErrCorrupt.
// GetMany fetches many blocks with Config.Concurrency ranged GETs in
// flight.
//
// # Sharing a bucket
//
// Open lists the index objects and reads every one of them, never the
// data, to build the in-memory map key → (segment, offset, size,
// checksum). A full rescan every Config.RescanInterval picks up the
// segments other nodes wrote, rewrote or deleted; a Get or Stat of a key
// the map lacks first lists the indexes of the last minute, at most once
// per Config.MissRescanInterval. Of two copies of one key, every node
// keeps the one in the newer segment. Capacity and Stats count the blocks
// of every node sharing the bucket, as this node last saw them.
//
// # Deletes
//
// Delete takes the block out of the map at once; removing it from its
// segment's index object happens in the background, in batches (see
// delete.go), and a segment left without blocks is deleted, data and
// index. Flush applies the pending deletes now. A crash (or a Close that
// times out) between a Delete and the rewrite of its index brings the
// block back after the next Open: intact and checksummed, never corrupt.
// Invalidate is the delete that does not return before the block is gone
// from the bucket's indexes, for the older copy of a key just replaced in
// a faster tier (tiers.Invalidator; see invalidate.go).
//
// # When the store is down
//
// Every request has a deadline (Config.RequestTimeout) and bounded
// retries with backoff. A request that fails, or has no answer after
// Config.ProbeTimeout, starts a probe of the bucket with that shorter
// deadline; if the probe fails too, the tier is marked unavailable at
// once (Available says why and since when) and the requests in flight are
// cut: a hung store holds a read for about 2×ProbeTimeout, not its
// RequestTimeout. After Config.FailureThreshold failed attempts in a row
// it is marked unavailable too. A probe of the bucket every
// Config.ProbeInterval marks it available again. Meanwhile Get and Stat of stored blocks fail at once with errors
// wrapping tiers.ErrUnavailable; blocks still in memory are served, and
// Put keeps buffering until Config.MaxPendingBytes, past which it fails at
// once with tiers.ErrBusy and ErrBacklog. Uploads pause and resume by
// themselves; a block the tier acknowledged is never dropped while the
// process lives. Close gives the store Config.CloseTimeout to take what is
// pending and reports what it could not upload.
//
// # Concurrency
//
// A Tier is safe for concurrent use. One mutex guards the map, the
// segments and the accounting; no request to the store is made under it,
// and block bytes in memory, never written once put, are copied out of
// it. Put never waits for the store; Get, Stat and GetMany wait at most
// RequestTimeout per block, and about 2×ProbeTimeout for a store that
// hangs. Scan copies the block list and calls fn
// without the lock, so fn may call the tier.
package s3

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// The tiers.Tier extras an S3 tier implements (see tiers/extras.go).
var (
	_ tiers.Tier                 = (*Tier)(nil)
	_ tiers.Invalidator          = (*Tier)(nil)
	_ tiers.ManyGetter           = (*Tier)(nil)
	_ tiers.PooledManyGetter     = (*Tier)(nil)
	_ tiers.ObjectLocator        = (*Tier)(nil)
	_ tiers.AvailabilityReporter = (*Tier)(nil)
	_ tiers.DetailReporter       = (*Tier)(nil)
)

// ErrBacklog marks a Put refused because Config.MaxPendingBytes of blocks
// already wait for their upload; such errors also match tiers.ErrBusy.
// Deleting stored blocks does not make room for it: the caller should
// drop the block or keep it where it is, and try again later.
var ErrBacklog = errors.New("s3: upload backlog full")

// Tier is the object-store tier. Open it with Open.
type Tier struct {
	cfg   Config
	lay   layout
	ids   *idSource
	store *store
	avail *availability
	ctr   counters

	mu       sync.Mutex
	closed   bool
	blocks   map[index.Key]*block
	used     int64 // Stats.Used
	pending  int64 // bytes of open and sealed segments
	open     map[index.NamespaceID]*segment
	sealed   []*segment         // waiting for or in their upload, in seal order
	segs     map[segID]*segment // sealed and stored
	deletes  map[*segment]map[index.Key]struct{}
	deleting int64  // deletes being applied
	gen      uint64 // rescans started
	rescans  int64

	// unlisted is set while the tier opened offline has not yet listed
	// the bucket (Config.OpenOffline).
	unlisted atomic.Bool

	// unsure counts, per key, the copies the bucket's index objects may
	// still list although the map dropped them: deletes queued or being
	// applied, and blocks deleted from a sealed segment whose index may
	// be in the store already (see invalidate.go).
	unsure map[index.Key]int

	deleteSem chan struct{} // one applyDeletes at a time

	missMu   sync.Mutex
	missRun  chan struct{} // the miss rescan in flight
	missLast time.Time

	getSlots    chan struct{} // ranged GETs in flight
	bufs        *bufpool.Pool // buffers of GetManyPooled's reads
	uploadSlots chan struct{} // background uploads in flight
	uploadWake  chan struct{}
	deleteWake  chan struct{}
	ctx         context.Context // background requests; cancelled by Close
	cancel      context.CancelFunc
	stop        chan struct{}
	wg          sync.WaitGroup
}

// Open connects to the bucket (creating it when cfg.CreateBucket is set),
// reads every index object under cfg.Prefix to rebuild the map, and
// starts the background uploader, deleter, rescanner and probe. It fails,
// with an error wrapping tiers.ErrUnavailable, when the store cannot be
// reached within ctx.
func Open(ctx context.Context, cfg Config) (*Tier, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tier{
		cfg:         cfg,
		lay:         newLayout(cfg.Prefix),
		ids:         newIDSource(),
		avail:       newAvailability(cfg.FailureThreshold, cfg.Logger),
		blocks:      map[index.Key]*block{},
		open:        map[index.NamespaceID]*segment{},
		segs:        map[segID]*segment{},
		deletes:     map[*segment]map[index.Key]struct{}{},
		unsure:      map[index.Key]int{},
		deleteSem:   make(chan struct{}, 1),
		getSlots:    make(chan struct{}, cfg.Concurrency),
		bufs:        bufpool.New(cfg.ReadBuffers),
		uploadSlots: make(chan struct{}, cfg.Concurrency),
		uploadWake:  make(chan struct{}, 1),
		deleteWake:  make(chan struct{}, 1),
		stop:        make(chan struct{}),
	}
	where := cfg.Endpoint + "/" + cfg.Bucket + "/" + t.lay.root
	var err error
	if t.store, err = newStore(&t.cfg, t.avail, &t.ctr); err != nil {
		return nil, fmt.Errorf("s3: open %s: %w", where, err)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.avail.watch(t.ctx, cfg.ProbeTimeout, func(ctx context.Context) error { return t.store.probe(ctx, false) })
	if err := t.connect(ctx); err != nil {
		if !cfg.OpenOffline || !unreachable(err) {
			t.cancel()
			t.avail.stop()
			return nil, fmt.Errorf("s3: open %s: %w", where, err)
		}
		t.avail.markDown(err)
		t.unlisted.Store(true)
		cfg.Logger.Warn("s3: store unreachable; the tier starts unavailable and lists the bucket once the store answers",
			"store", where, "err", err)
	}
	t.wg.Add(4)
	go t.uploadLoop()
	go t.deleteLoop()
	go t.rescanLoop()
	go t.probeLoop()
	return t, nil
}

// connect checks the bucket (creating it if allowed) and lists every index
// object to rebuild the map.
func (t *Tier) connect(ctx context.Context) error {
	if err := t.store.ensureBucket(ctx, t.cfg.CreateBucket); err != nil {
		return err
	}
	if err := t.rescan(ctx, true); err != nil {
		return fmt.Errorf("list the segments: %w", err)
	}
	t.unlisted.Store(false)
	return nil
}

// unreachable reports whether an error of Open means the store could not
// be reached, rather than that it answered and refused.
func unreachable(err error) bool {
	return errors.Is(err, tiers.ErrUnavailable) && retryable(err)
}

// Put stores value under m.Key, replacing any block there; see
// tiers.Tier. The block goes into memory and is uploaded later; Put never
// talks to the store. It fails with tiers.ErrFull when the tier holds
// Capacity, and with ErrBacklog (which matches tiers.ErrBusy) when
// MaxPendingBytes wait for their upload, an error that also wraps the
// store's *UnavailableError while it is down.
func (t *Tier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, t.cfg.MaxBlockSize); err != nil {
		return fmt.Errorf("s3: put %v: %w", m.Key, err)
	}
	data := make([]byte, len(value))
	copy(data, value)

	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("s3: put %v: %w", m.Key, tiers.ErrClosed)
	}
	old := t.blocks[m.Key]
	var oldCost, oldPending int64
	if old != nil {
		oldCost = cost(old.meta.Size)
		if old.seg.state == segOpen {
			oldPending = int64(old.meta.Size)
		}
	}
	if used := t.used - oldCost + cost(m.Size); used > t.capacity() {
		return fmt.Errorf("s3: put %v: %w: %s more would take it to %s of %s", m.Key, tiers.ErrFull,
			units.FormatBytes(cost(m.Size)), units.FormatBytes(used), units.FormatBytes(t.capacity()))
	}
	if pending := t.pending - oldPending + int64(m.Size); pending > t.cfg.MaxPendingBytes {
		err := fmt.Errorf("s3: put %v: %w (%w): %s wait for their upload, limit %s", m.Key, tiers.ErrBusy, ErrBacklog,
			units.FormatBytes(t.pending), units.FormatBytes(t.cfg.MaxPendingBytes))
		if down := t.avail.err(); down != nil {
			err = fmt.Errorf("%w; %w", err, down)
		}
		return err
	}
	if old != nil {
		t.unlinkLocked(old, true)
	}
	t.addLocked(&block{meta: m, data: data}, time.Now())
	return nil
}

// Delete removes a block from the tier at once and from its segment's
// index object within DeleteDelay; see the package doc. It never waits
// for the store.
func (t *Tier) Delete(key index.Key) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("s3: delete %v: %w", key, tiers.ErrClosed)
	}
	b := t.blocks[key]
	if b == nil {
		return fmt.Errorf("s3: delete %v: %w", key, tiers.ErrNotFound)
	}
	t.unlinkLocked(b, true)
	return nil
}

// Scan calls fn for every block in the map, in memory or stored, by this
// node or another, until fn returns false.
func (t *Tier) Scan(fn func(index.Header) bool) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("s3: scan: %w", tiers.ErrClosed)
	}
	metas := make([]index.Header, 0, len(t.blocks))
	for _, b := range t.blocks {
		metas = append(metas, b.meta)
	}
	t.mu.Unlock()
	for _, m := range metas {
		if !fn(m) {
			break
		}
	}
	return nil
}

// Available returns nil while the store is reachable, else an
// *UnavailableError that says since when and why, and matches
// tiers.ErrUnavailable.
func (t *Tier) Available() error { return t.avail.err() }

// Close uploads the pending segments and applies the pending deletes,
// spending at most CloseTimeout (waiting for an unavailable store to come
// back, if need be), then stops the background work. Blocks it could not
// upload are lost, and Close says how many. Later calls of
// every method fail with tiers.ErrClosed; a second Close returns nil.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.CloseTimeout)
	t.mu.Lock()
	work := len(t.open) + len(t.sealed) + len(t.deletes)
	t.mu.Unlock()
	if work > 0 && t.avail.err() != nil {
		select { // the probe may find the store back in time
		case <-t.avail.upCh():
		case <-ctx.Done():
		}
	}
	err := t.flush(ctx)
	cancel()
	close(t.stop)
	t.cancel()
	t.wg.Wait()
	t.avail.stop()
	if err == nil {
		return nil
	}
	t.mu.Lock()
	var blocks int
	for _, seg := range t.sealed {
		blocks += len(seg.members)
	}
	pending := t.pending
	t.mu.Unlock()
	if blocks == 0 {
		return fmt.Errorf("s3: close: some deletes were not applied and may come back: %w", err)
	}
	return fmt.Errorf("s3: close: %d blocks (%s) were not uploaded and are lost: %w", blocks, units.FormatBytes(pending), err)
}

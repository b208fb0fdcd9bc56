package s3

import (
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/tiers"
)

// BlockOverhead is the fixed cost in bytes that the tier counts for each
// block on top of its size: its index entry, stored once per segment, and
// its share of the index header and trailer, rounded up.
const BlockOverhead = 64

// cost is what a block counts against Capacity.
func cost(size uint32) int64 { return int64(size) + BlockOverhead }

// counters are the tier's running totals since Open.
type counters struct {
	uploads        atomic.Int64 // objects written: segment data and index objects
	uploadedBytes  atomic.Int64
	rangedGets     atomic.Int64 // ranged GET requests sent, retries included
	rangedGetBytes atomic.Int64 // bytes they returned
	indexReads     atomic.Int64 // index objects read
	lists          atomic.Int64 // listing requests
	requestErrors  atomic.Int64 // failed request attempts
	corruptBlocks  atomic.Int64 // blocks dropped because their bytes failed their checksum
	corruptIndexes atomic.Int64 // index objects that failed to decode
	indexRewrites  atomic.Int64 // index objects rewritten without deleted blocks
	segmentDeletes atomic.Int64 // segments deleted, data and index, once all their blocks were
	garbageDeletes atomic.Int64 // data objects no index named, deleted by the sweep
}

// S3Stats is what the tier knows about its store at one instant. Counts
// of requests and bytes run since Open; the rest is the current state as
// this node sees it, which covers the segments of every node sharing the
// bucket as of its last rescan.
type S3Stats struct {
	Segments    int64 // segments stored in the bucket
	Objects     int64 // objects in the bucket: a data and an index object per segment
	StoredBytes int64 // bytes of those objects, deleted blocks not yet reclaimed included
	LiveBytes   int64 // bytes of the live blocks in stored segments

	PendingSegments int64 // segments in memory, open or waiting for their upload
	PendingBytes    int64 // block bytes in them, counted against MaxPendingBytes
	PendingDeletes  int64 // deleted blocks not yet removed from their index objects

	Uploads        int64 // objects written
	UploadedBytes  int64
	RangedGets     int64 // ranged GET requests sent, retries included
	RangedGetBytes int64 // bytes they returned
	IndexReads     int64 // index objects read (Open, rescans, delete rewrites)
	Lists          int64 // listing requests
	Rescans        int64 // listings of the index objects, periodic or after a miss
	RequestErrors  int64 // failed request attempts
	CorruptBlocks  int64 // blocks dropped because their bytes failed their checksum
	CorruptIndexes int64 // index objects that failed to decode, whose blocks are unknown
	IndexRewrites  int64 // index objects rewritten without deleted blocks
	SegmentDeletes int64 // segments deleted once all their blocks were
	GarbageDeletes int64 // data objects no index named, deleted (Config.GarbageAge)
	ReadBuffers    int64 // buffers GetManyPooled read ranges into
	ReusedBuffers  int64 // of them, released buffers filled again rather than allocated

	Available bool      // whether the store is reachable (see Tier.Available)
	Since     time.Time // since when it is (or is not)
	Cause     string    // why it is not, when it is not
}

// Stats returns the tier's accounting: Used counts every live block, in
// memory or in the bucket, as its size plus BlockOverhead.
func (t *Tier) Stats() tiers.Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tiers.Stats{Capacity: t.capacity(), Used: t.used, Blocks: int64(len(t.blocks))}
}

func (t *Tier) capacity() int64 {
	if t.cfg.Capacity == 0 {
		return UnlimitedCapacity
	}
	return t.cfg.Capacity
}

// S3Stats returns the tier's view of its store and its request counts.
func (t *Tier) S3Stats() S3Stats {
	var s S3Stats
	t.mu.Lock()
	for _, seg := range t.segs {
		if seg.state == segStored {
			s.Segments++
			s.StoredBytes += seg.dataSize + seg.indexSize
			s.LiveBytes += seg.live
		}
	}
	s.PendingSegments = int64(len(t.open) + len(t.sealed))
	s.PendingBytes = t.pending
	s.PendingDeletes = t.deleting
	for _, keys := range t.deletes {
		s.PendingDeletes += int64(len(keys))
	}
	s.Rescans = t.rescans
	t.mu.Unlock()
	s.Objects = 2 * s.Segments

	c := &t.ctr
	s.Uploads, s.UploadedBytes = c.uploads.Load(), c.uploadedBytes.Load()
	s.RangedGets, s.RangedGetBytes = c.rangedGets.Load(), c.rangedGetBytes.Load()
	s.IndexReads, s.Lists = c.indexReads.Load(), c.lists.Load()
	s.RequestErrors = c.requestErrors.Load()
	s.CorruptBlocks, s.CorruptIndexes = c.corruptBlocks.Load(), c.corruptIndexes.Load()
	s.IndexRewrites, s.SegmentDeletes = c.indexRewrites.Load(), c.segmentDeletes.Load()
	s.GarbageDeletes = c.garbageDeletes.Load()
	s.ReadBuffers, s.ReusedBuffers, _ = t.bufs.Stats()
	var cause error
	s.Available, s.Since, cause = t.avail.state()
	if cause != nil {
		s.Cause = cause.Error()
	}
	return s
}

// Detail returns S3Stats' counters by name, for kvctl stats and the
// node's metrics (tiers.LevelStats.Detail).
func (t *Tier) Detail() map[string]int64 {
	s := t.S3Stats()
	return map[string]int64{
		"segments": s.Segments, "objects": s.Objects, "stored_bytes": s.StoredBytes, "live_bytes": s.LiveBytes,
		"pending_segments": s.PendingSegments, "pending_bytes": s.PendingBytes, "pending_deletes": s.PendingDeletes,
		"uploads": s.Uploads, "uploaded_bytes": s.UploadedBytes, "ranged_gets": s.RangedGets,
		"ranged_get_bytes": s.RangedGetBytes, "rescans": s.Rescans, "request_errors": s.RequestErrors,
		"corrupt_blocks": s.CorruptBlocks, "corrupt_indexes": s.CorruptIndexes,
		"index_rewrites": s.IndexRewrites, "segment_deletes": s.SegmentDeletes, "garbage_deletes": s.GarbageDeletes,
	}
}

package s3

import (
	"errors"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// maxSegmentBlocks bounds the blocks of one segment, and so the size of an
// index object (about 3 MiB): it matters only for tiny blocks.
const maxSegmentBlocks = 1 << 16

// maxIndexBytes is the largest index object the tier reads.
var maxIndexBytes = indexSize(maxSegmentBlocks)

// segState is where a segment is in its life.
type segState uint8

const (
	// segOpen: in memory, taking the blocks put into its namespace.
	segOpen segState = iota
	// segSealed: in memory, its id and layout fixed, waiting for its
	// upload, in it, or waiting to try again.
	segSealed
	// segStored: its data and index objects are in the bucket.
	segStored
	// segGone: dropped before its upload (all its blocks were deleted),
	// deleted from the bucket, or found gone.
	segGone
)

// segment is a group of blocks stored as one data object and one index
// object. The Tier's mutex guards every field, except that layout and
// bytes do not change once the segment is sealed.
type segment struct {
	id      segID // set when sealed
	ns      index.NamespaceID
	state   segState
	members map[*block]struct{} // the live blocks stored here
	live    int64               // bytes of the members

	// Open and sealed segments.
	layout []*block // open: in put order, deleted blocks included; sealed: live at the seal, with offsets
	bytes  int64    // open: bytes of the members; sealed: size of the data object, all pending
	opened time.Time

	// Sealed segments.
	uploading bool          // an upload has claimed it
	done      chan struct{} // closed when that upload ends
	dataDone  bool          // the data object is written; only the index is left
	failures  int           // failed uploads in a row
	retryAt   time.Time     // the background uploader waits until then
	// indexTried is set once an upload has taken the segment's index to
	// write it: from then on an index object listing the blocks it took
	// may be in the store, even after a failed attempt. dropped holds
	// the keys of the blocks deleted since, until the segment is stored
	// (their removal from the index is then queued) or gone.
	indexTried bool
	dropped    map[index.Key]struct{}

	// Stored segments.
	dataSize, indexSize int64
	etag                string // of the index object, as this node last wrote or read it
	version             uint64 // bumped whenever this node starts or ends a rewrite of the index
	rewriting           bool   // a rewrite of the index is in flight
	gen                 uint64 // the rescan generation in which the tier learnt of it
}

// block is one live or recently deleted block.
type block struct {
	meta index.Header
	seg  *segment
	off  int64  // in the data object; set when the segment is sealed
	data []byte // the bytes, until the segment is stored
}

func newSegment(ns index.NamespaceID, state segState, now time.Time) *segment {
	return &segment{ns: ns, state: state, members: map[*block]struct{}{}, opened: now}
}

// addLocked appends a new block to the open segment of its namespace,
// sealing that segment first when the block would take it past
// SegmentSize, and after when the block fills it. The caller has checked
// room and unlinked any old block of the key.
func (t *Tier) addLocked(b *block, now time.Time) {
	ns := b.meta.Key.NS
	size := int64(b.meta.Size)
	seg := t.open[ns]
	if seg != nil && seg.bytes > 0 && seg.bytes+size > t.cfg.SegmentSize {
		t.sealLocked(seg, now)
		seg = nil
	}
	if seg == nil {
		seg = newSegment(ns, segOpen, now)
		t.open[ns] = seg
	}
	b.seg = seg
	seg.layout = append(seg.layout, b)
	seg.bytes += size
	t.pending += size
	t.linkLocked(b)
	if seg.bytes >= t.cfg.SegmentSize || len(seg.layout) >= maxSegmentBlocks {
		t.sealLocked(seg, now)
	}
}

// linkLocked enters b, whose seg is set, in the map and in its segment.
func (t *Tier) linkLocked(b *block) {
	t.blocks[b.meta.Key] = b
	b.seg.members[b] = struct{}{}
	b.seg.live += int64(b.meta.Size)
	t.used += cost(b.meta.Size)
}

// unlinkLocked takes b, which the map holds, out of the map and out of
// its segment. An open segment forgets its bytes at once (and is dropped
// when it has no block left); a stored one, when remote is set, has the
// block queued for removal from its index object. A sealed segment keeps
// the bytes and uploads them; the upload queues the removal if its index
// lists the block (commitLocked).
func (t *Tier) unlinkLocked(b *block, remote bool) {
	delete(t.blocks, b.meta.Key)
	seg := b.seg
	delete(seg.members, b)
	seg.live -= int64(b.meta.Size)
	t.used -= cost(b.meta.Size)
	switch seg.state {
	case segOpen:
		seg.bytes -= int64(b.meta.Size)
		t.pending -= int64(b.meta.Size)
		b.data = nil
		if len(seg.members) == 0 {
			delete(t.open, seg.ns)
			seg.state = segGone
		}
	case segSealed:
		if seg.indexTried {
			t.droppedLocked(seg, b.meta.Key)
		}
	case segStored:
		if remote {
			t.queueDeleteLocked(seg, b.meta.Key)
		}
	}
}

// sealLocked fixes an open segment's id and layout and queues it for
// upload.
func (t *Tier) sealLocked(seg *segment, now time.Time) {
	delete(t.open, seg.ns)
	seg.id = t.ids.next(now)
	seg.state = segSealed
	seg.layout = slices.DeleteFunc(seg.layout, func(b *block) bool { return !isMember(seg, b) })
	var off int64
	for _, b := range seg.layout {
		b.off = off
		off += int64(b.meta.Size)
	}
	seg.bytes = off
	t.segs[seg.id] = seg
	t.sealed = append(t.sealed, seg)
	t.wakeUploader()
}

func isMember(seg *segment, b *block) bool {
	_, ok := seg.members[b]
	return ok
}

// sealExpiredLocked seals the open segments older than FlushInterval, or
// every open segment when all is set.
func (t *Tier) sealExpiredLocked(now time.Time, all bool) {
	for _, seg := range t.open {
		if all || now.Sub(seg.opened) >= t.cfg.FlushInterval {
			t.sealLocked(seg, now)
		}
	}
}

// indexLocked returns the index of a sealed segment as it is now (its
// live blocks) and those blocks.
func (t *Tier) indexLocked(seg *segment) (*segIndex, []*block) {
	x := &segIndex{ID: seg.id, DataSize: seg.bytes}
	var blocks []*block
	for _, b := range seg.layout {
		if isMember(seg, b) {
			x.Entries = append(x.Entries, indexEntry{Meta: b.meta, Offset: b.off})
			blocks = append(blocks, b)
		}
	}
	return x, blocks
}

// commitLocked records that a sealed segment's data and index, listing
// indexed, are in the bucket: its blocks are read from there from now on.
// Blocks deleted while the index was being written are queued for
// removal from it.
func (t *Tier) commitLocked(seg *segment, indexed []*block, etag string, indexSize int64) {
	t.unsealLocked(seg)
	seg.state = segStored
	seg.dataSize, seg.indexSize, seg.etag = seg.bytes, indexSize, etag
	seg.gen = t.gen
	for _, b := range seg.layout {
		b.data = nil
	}
	seg.layout = nil
	for _, b := range indexed {
		if !isMember(seg, b) {
			t.queueDeleteLocked(seg, b.meta.Key)
		}
	}
}

// dropSealedLocked forgets a sealed segment that has no block left.
func (t *Tier) dropSealedLocked(seg *segment) {
	t.unsealLocked(seg)
	seg.state = segGone
	seg.layout = nil
	delete(t.segs, seg.id)
}

// unsealLocked takes a sealed segment out of the upload queue and its
// bytes out of the pending count.
func (t *Tier) unsealLocked(seg *segment) {
	t.pending -= seg.bytes
	for key := range seg.dropped {
		t.unsureLocked(key, -1)
	}
	seg.dropped = nil
	if i := slices.Index(t.sealed, seg); i >= 0 {
		t.sealed = slices.Delete(t.sealed, i, i+1)
	}
}

// forgetSegmentLocked forgets a stored segment that is gone from the
// bucket, or about to be, with every block the map still has of it.
func (t *Tier) forgetSegmentLocked(seg *segment) {
	if seg.state != segStored {
		return
	}
	for b := range seg.members {
		t.unlinkLocked(b, false)
	}
	delete(t.segs, seg.id)
	for key := range t.deletes[seg] {
		t.unsureLocked(key, -1)
	}
	delete(t.deletes, seg)
	seg.state = segGone
}

// segmentReader reads a sealed segment's data object out of its blocks'
// bytes without copying them into one buffer. Read and Seek serve a
// single PUT; ReadAt, safe for concurrent use, the parts of a multipart
// upload.
type segmentReader struct {
	offs  []int64 // offset of each piece
	parts [][]byte
	size  int64
	pos   int64
}

// newSegmentReaderLocked captures the bytes of a sealed segment's layout.
func newSegmentReaderLocked(seg *segment) *segmentReader {
	r := &segmentReader{size: seg.bytes}
	for _, b := range seg.layout {
		if b.meta.Size > 0 {
			r.offs = append(r.offs, b.off)
			r.parts = append(r.parts, b.data)
		}
	}
	return r
}

func (r *segmentReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("s3: segment reader: negative offset")
	}
	n := 0
	i := sort.Search(len(r.offs), func(i int) bool { return r.offs[i]+int64(len(r.parts[i])) > off })
	for ; n < len(p) && i < len(r.parts); i++ {
		c := copy(p[n:], r.parts[i][off+int64(n)-r.offs[i]:])
		n += c
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (r *segmentReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	n, err := r.ReadAt(p, r.pos)
	r.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (r *segmentReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return 0, errors.New("s3: segment reader: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("s3: segment reader: negative position")
	}
	r.pos = offset
	return offset, nil
}

package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
)

// ReadAhead reads the blocks of a Get, in order, ahead of their sending. Blocks
// whose fastest copy is not in the top tier (an SSD, an object store) are
// read in chunks of prefetchChunk blocks through the hierarchy's ReadMany —
// which turns a chunk of a chain stored together in an object store into
// one ranged GET, and reads a chunk on an SSD with several reads in flight — with up to FetchConcurrency/4 chunks in flight ahead of
// the block being sent (a chunk of blocks in an object store covers the
// blocks of one object instead: see maxObjectChunk); blocks already in the
// top tier are opened in place when their turn comes. A long context thus streams back in order at the
// pace of a few large parallel reads, holding at most the chunks in flight
// in memory. The chunks are read into buffers the object store's tier
// reuses: a block's buffer goes back once the block is sent (the release
// Next returns) and its promotion, if any, has copied it up.
// A Get of one block has nothing to read ahead of: its block is opened
// when Next asks for it, as a block of the top tier is (a View, which
// reads a block held lower into a copy), with one lookup in the hierarchy
// and no goroutine started for it and waited for at once.
// Hand the blocks out with Next, then Close it.
func (n *Node) ReadAhead(keys []index.Key) *ReadAhead {
	ctx, cancel := context.WithCancel(context.Background())
	p := &ReadAhead{n: n, keys: keys, slots: make([]slot, len(keys)), ctx: ctx, cancel: cancel,
		maxChunks: max(1, n.cfg.FetchConcurrency/4)}
	if len(keys) == 1 {
		return p
	}
	top := n.h.Kinds()[0]
	var stored []int // read ahead from an object store
	for i, k := range keys {
		if m, kind, err := n.h.Stat(k); err != nil || kind != top {
			p.slots[i].done = make(chan struct{}) // read ahead (a miss may be found in a shared tier)
			if err == nil && kind == index.TierS3 {
				stored = append(stored, i)
				p.slots[i].size = int64(m.Size)
			}
		}
	}
	p.locate(stored)
	p.mu.Lock()
	p.startLocked()
	p.mu.Unlock()
	return p
}

// prefetchChunk is how many slow blocks one read ahead covers, but for
// blocks in an object store (see maxObjectChunk).
const prefetchChunk = 16

// maxObjectChunk is the most bytes one read ahead covers of blocks in one
// object of an object store. Past the first, small chunks, a chunk of such
// blocks covers the blocks of one object, up to this many bytes, rather
// than prefetchChunk blocks: a chain demoted together is stored in
// segment objects of the tier's SegmentSize (64 MiB by default), so that
// one ranged GET then reads one whole segment object, which a store may
// serve more cheaply than a part of one (versitygw sends a whole file with
// sendfile and copies a part through a buffer), and no segment is split
// between two requests.
const maxObjectChunk = 64 << 20

// ReadAhead is the read ahead of one Get (see Node.ReadAhead). Next and
// Close may be called from different goroutines.
type ReadAhead struct {
	n         *Node
	keys      []index.Key
	slots     []slot
	ctx       context.Context // ends when the Get does
	cancel    context.CancelFunc
	maxChunks int

	mu      sync.Mutex
	next    int // the next block Open hands out
	started int // blocks before it are being read ahead, or need not be
	chunks  int // reads ahead in flight
	issued  int // reads ahead started so far
	closed  bool
}

// slot is one block of the Get; done is nil for blocks opened in place.
type slot struct {
	done  chan struct{}
	data  []byte
	ref   *bufpool.Buffer // the reference on data's pooled buffer, until Next or Close takes it
	meta  index.Header
	err   error
	start time.Time

	object string // the object-store object holding the block, if any (see maxObjectChunk)
	size   int64  // the block's size, for a block in an object store
}

// startLocked starts the reads ahead the window allows: chunks in flight
// stay under maxChunks and within maxChunks chunks of the next block. The
// first chunks are small (1, 2, 4, … blocks), and the first is read alone,
// so that the first block goes out after one small read, not after a whole
// chunk. A chunk never spans two objects of an object store; past the
// small ones, it covers the rest of its object, up to maxObjectChunk
// bytes.
func (p *ReadAhead) startLocked() {
	for p.chunks < p.maxChunks && p.started < len(p.slots) && p.started < p.next+p.maxChunks*prefetchChunk {
		if p.issued == 1 && p.chunks == 1 {
			break // the first block alone: it arrives sooner without company
		}
		var idx []int
		size := min(prefetchChunk, 1<<min(p.issued, 4))
		ramped := size == prefetchChunk
		p.issued++
		var object string // of the chunk's first block: the chunk stays within it
		var n int64       // the chunk's bytes
		for ; p.started < len(p.slots) && len(idx) < size; p.started++ {
			s := &p.slots[p.started]
			if s.done == nil {
				continue
			}
			if len(idx) == 0 {
				object = s.object
				if object != "" && ramped {
					size = len(p.slots) // the whole object, up to maxObjectChunk bytes
				}
			} else if s.object != object || (object != "" && ramped && n+s.size > maxObjectChunk) {
				break // the next chunk starts here
			}
			n += s.size
			s.start = time.Now()
			idx = append(idx, p.started)
		}
		if len(idx) > 0 {
			p.chunks++
			go p.read(idx)
		}
	}
}

// locate notes which object of an object store holds each of the blocks
// of slots idx, whose fastest copy is there, so that startLocked can make
// chunks that follow objects. Blocks on the SSD are not looked up: their
// chunks are of prefetchChunk blocks.
func (p *ReadAhead) locate(idx []int) {
	if len(idx) < 2 {
		return
	}
	keys := make([]index.Key, len(idx))
	for j, i := range idx {
		keys[j] = p.keys[i]
	}
	places, err := p.n.h.Locate(p.ctx, keys)
	if err != nil {
		return // chunks of prefetchChunk blocks, then
	}
	for j, i := range idx {
		if places[j].InObject {
			p.slots[i].object = places[j].Object.Object
		}
	}
}

// read reads the blocks of one chunk, handing each over as it arrives.
func (p *ReadAhead) read(idx []int) {
	keys := make([]index.Key, len(idx))
	for j, i := range idx {
		keys[j] = p.keys[i]
	}
	delivered := make([]bool, len(idx))
	err := p.n.h.ReadManyPooled(p.ctx, keys, func(j int, v []byte, ref *bufpool.Buffer, m index.Header, _ index.TierKind, err error) {
		p.mu.Lock()
		s := &p.slots[idx[j]]
		if p.closed { // no one will send it
			ref.Release()
			v, ref, err = nil, nil, errClosed
		}
		s.data, s.ref, s.meta, s.err = v, ref, m, err
		p.mu.Unlock()
		delivered[j] = true
		close(s.done)
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	for j, ok := range delivered { // a ReadMany that failed as a whole
		if !ok {
			s := &p.slots[idx[j]]
			s.err = fmt.Errorf("node: reading %v ahead: %w", p.keys[idx[j]], err)
			close(s.done)
		}
	}
	p.chunks--
	if !p.closed {
		p.startLocked()
	}
}

// Next hands out the next block of the Get, key, waiting for its read:
// its meta and bytes, a release to call once they are written out, and
// when its read started.
func (p *ReadAhead) Next(key index.Key) (index.Header, []byte, func(), time.Time, error) {
	m, data, _, release, start, err := p.hand(key, false)
	return m, data, release, start, err
}

// NextDevice is Next that hands a block held in device memory out in
// place (see Node.ViewDevice): either its bytes or its DeviceView, which
// the release it returns releases.
func (p *ReadAhead) NextDevice(key index.Key) (index.Header, []byte, tiers.DeviceView, func(), time.Time, error) {
	return p.hand(key, true)
}

func (p *ReadAhead) hand(key index.Key, device bool) (index.Header, []byte, tiers.DeviceView, func(), time.Time, error) {
	p.mu.Lock()
	i := p.next
	if i >= len(p.keys) || p.keys[i] != key {
		p.mu.Unlock()
		return index.Header{}, nil, nil, nil, time.Time{}, fmt.Errorf("node: prefetched get opened %v out of order", key)
	}
	p.next++
	p.startLocked()
	s := &p.slots[i]
	p.mu.Unlock()
	if s.done == nil { // in the top tier: sent from where it lies
		start := time.Now()
		if device {
			v, dv, _, err := p.n.ViewDevice(key)
			if err != nil {
				return index.Header{}, nil, nil, nil, time.Time{}, err
			}
			if dv != nil {
				return dv.Meta(), nil, dv, func() { _ = dv.Release() }, start, nil
			}
			return v.Meta(), v.Bytes(), nil, func() { _ = v.Release() }, start, nil
		}
		v, _, err := p.n.View(key)
		if err != nil {
			return index.Header{}, nil, nil, nil, time.Time{}, err
		}
		return v.Meta(), v.Bytes(), nil, func() { _ = v.Release() }, start, nil
	}
	<-s.done
	p.mu.Lock()
	data, ref, m, err := s.data, s.ref, s.meta, s.err
	s.data, s.ref = nil, nil // the transport owns them now
	if err == nil && p.closed {
		err = errClosed
	}
	p.mu.Unlock()
	if err != nil {
		ref.Release()
		return index.Header{}, nil, nil, nil, time.Time{}, err
	}
	return m, data, nil, ref.Release, s.start, nil
}

// errClosed fails the blocks of a Get that ended before they were sent.
var errClosed = errors.New("node: the get ended before this block was sent")

// Close ends the Get: reads ahead still in flight are cancelled, and the
// buffers of blocks read but not handed out are let go.
func (p *ReadAhead) Close() {
	p.mu.Lock()
	p.closed = true
	for i := range p.slots {
		s := &p.slots[i]
		s.ref.Release()
		s.data, s.ref = nil, nil
	}
	p.mu.Unlock()
	p.cancel()
}

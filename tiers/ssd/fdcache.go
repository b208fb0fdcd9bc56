package ssd

import (
	"sync"

	"golang.org/x/sys/unix"
)

// # Open block files
//
// When Config.FS is the operating system's (vfs.Default), block files are
// read through bare descriptors (readfile.go), and the descriptors of
// small blocks' files are kept open for the next read of the same file,
// up to Config.OpenFiles of them: a hit on the SSD then costs a pread and
// no open or close, which are the larger part of the system calls of a
// 64 KiB hit.
//
// This is safe because a block file never changes once its record names
// it, and is known by its number, which no other file of the tier ever
// takes (blockfile.go): a descriptor cached under number gen reads the
// bytes the record naming gen describes, and a reader reaches it only
// through that record, under the key's lock. A file leaves the cache when
// its record stops naming it (doom, under the key's lock, before its
// removal can free its space), when a read of it fails, on Close, and when
// newer files push it out. A descriptor is closed only once the cache and
// every reader holding it are done with it, so that a descriptor number
// is never reused under a pread still using it.

// sharedFD is a descriptor of a block file open for reading, with its
// holders counted: the cache while it keeps it, and each reader. One
// opened for a single read (uncached) has that reader only.
type sharedFD struct {
	fd  int
	gen uint64
	// direct says fd was opened with O_DIRECT and still reads so; only an
	// uncached descriptor is ever direct.
	direct bool
	// warm says every page of the block was in the page cache when the
	// file was opened (cachestat; readfile.go); only an uncached
	// descriptor of a large block is ever known so.
	warm bool

	refs       int // guarded by fdCache.mu when cached
	cached     bool
	prev, next *sharedFD // the cache's recency list, most recent first
}

// fdCache keeps descriptors of block files open, by file number, up to a
// bound. It is safe for concurrent use.
type fdCache struct {
	max int

	mu     sync.Mutex
	files  map[uint64]*sharedFD
	list   sharedFD // sentinel of the recency list
	closed bool

	hits, opens int64 // for tests
}

// newFDCache returns a cache of up to max descriptors, and at most a
// quarter of the process's limit on open files (RLIMIT_NOFILE); none for
// max ≤ 0.
func newFDCache(max int) *fdCache {
	var lim unix.Rlimit
	if max > 0 && unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur/4 < uint64(max) {
		max = int(lim.Cur / 4)
	}
	c := &fdCache{max: max, files: map[uint64]*sharedFD{}}
	c.list.prev, c.list.next = &c.list, &c.list
	return c
}

// get returns the cached descriptor of file gen with one more holder, or
// nil.
func (c *fdCache) get(gen uint64) *sharedFD {
	if c.max <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.files[gen]
	if f == nil {
		return nil
	}
	f.refs++
	c.hits++
	c.unlink(f)
	c.pushFront(f)
	return f
}

// add caches f, a descriptor of file gen just opened with one holder, the
// caller, and returns the descriptor the caller reads with: f, or one
// another reader cached meanwhile (f is then closed). A closed or
// disabled cache keeps nothing: f is returned, for the caller's read only.
func (c *fdCache) add(f *sharedFD) *sharedFD {
	c.mu.Lock()
	c.opens++
	if c.closed || c.max <= 0 {
		c.mu.Unlock()
		return f
	}
	if old := c.files[f.gen]; old != nil {
		old.refs++
		c.unlink(old)
		c.pushFront(old)
		c.mu.Unlock()
		_ = unix.Close(f.fd)
		return old
	}
	f.refs++ // the cache's
	f.cached = true
	c.files[f.gen] = f
	c.pushFront(f)
	var out *sharedFD
	if len(c.files) > c.max {
		out = c.list.prev
		c.removeLocked(out)
		if out.refs > 0 {
			out = nil
		}
	}
	c.mu.Unlock()
	if out != nil {
		_ = unix.Close(out.fd)
	}
	return f
}

// release drops one holder of f, closing it once none is left.
func (c *fdCache) release(f *sharedFD) {
	if !f.cached {
		_ = unix.Close(f.fd)
		return
	}
	c.mu.Lock()
	f.refs--
	last := f.refs == 0
	c.mu.Unlock()
	if last {
		_ = unix.Close(f.fd)
	}
}

// evict drops the cache's hold of file gen, if it has one: the file's
// record no longer names it, or a read of it failed. Readers holding it
// finish with it first.
func (c *fdCache) evict(gen uint64) {
	c.mu.Lock()
	f := c.files[gen]
	if f == nil {
		c.mu.Unlock()
		return
	}
	c.removeLocked(f)
	last := f.refs == 0
	c.mu.Unlock()
	if last {
		_ = unix.Close(f.fd)
	}
}

// close drops every descriptor the cache holds and keeps none from now
// on; readers still holding one close it when done.
func (c *fdCache) close() {
	c.mu.Lock()
	c.closed = true
	var last []int
	for c.list.next != &c.list {
		f := c.list.next
		c.removeLocked(f)
		if f.refs == 0 {
			last = append(last, f.fd)
		}
	}
	c.mu.Unlock()
	for _, fd := range last {
		_ = unix.Close(fd)
	}
}

// removeLocked takes f out of the cache and drops the cache's hold; the
// caller holds c.mu and closes f if no holder is left (f.refs == 0).
// f stays marked cached, so that its last release, under c.mu, closes it.
func (c *fdCache) removeLocked(f *sharedFD) {
	delete(c.files, f.gen)
	c.unlink(f)
	f.refs--
}

func (c *fdCache) unlink(f *sharedFD) {
	f.prev.next, f.next.prev = f.next, f.prev
	f.prev, f.next = nil, nil
}

func (c *fdCache) pushFront(f *sharedFD) {
	f.prev, f.next = &c.list, c.list.next
	c.list.next.prev = f
	c.list.next = f
}

// stats returns the cache's hits, the descriptors opened for it, and
// how many it holds.
func (c *fdCache) stats() (hits, opens int64, held int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.opens, len(c.files)
}

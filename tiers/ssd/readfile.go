package ssd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"github.com/cockroachdb/pebble/v2/vfs"
	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// # Reading block files
//
// Through Config.FS, opening a file for reading costs several system
// calls besides the open: the os.File behind it asks for its flags, the
// file system's type (for sync_file_range) and a registration with the
// network poller, which fails for a regular file. When Config.FS is the
// operating system's, block files are read through bare descriptors
// instead: open, pread, close, and the descriptors of small blocks' files
// stay open for the next read (fdcache.go). Any other FS (the tests'
// fault injection) is read through as before.
//
// # Direct reads
//
// A block of directMin bytes or more whose file has no page in the page
// cache is read with O_DIRECT, straight from the disk into the reader's
// buffer: the kernel allocates no page cache for it and copies nothing,
// which is most of the CPU a cold read of a large block costs, and the
// bytes, which the hierarchy keeps in the levels above once read, are not
// cached twice. A file with any page cached — written lately and maybe
// still dirty, or read lately — is read through the page cache as before,
// so that a direct read neither forces a write-back nor goes to the disk
// for bytes in memory (cachestat(2) tells, one system call). A direct read
// needs a buffer aligned to directAlign bytes with room for the block
// rounded up to a multiple of it (the tier's pooled buffers and its own
// allocations have it; a caller's buffer for Get may not): with anything
// else, or where the kernel or file system refuses (EINVAL, ENOSYS), the
// file is read through the page cache, and a refusal turns direct reads
// off for the tier. The checksum covers the block's own bytes, never the
// rounding.
const (
	// directMin is the smallest block read directly: the sizes the tier is
	// for (a KV-cache block is 0.5–4 MiB). Smaller blocks' files are kept
	// open instead (fdcache.go).
	directMin = 512 << 10
	// directAlign is the alignment of a direct read's buffer and length:
	// the page size, a multiple of every common logical block size.
	directAlign = 4096
)

// readFile is a block file open for reading: through Config.FS (vf), or
// a bare descriptor (fd), cached or of this read only.
type readFile struct {
	vf vfs.File
	fd *sharedFD
	b  *blockFiles
}

// rawReads reports whether block files are read through bare descriptors.
func (b *blockFiles) rawReads() bool { return b.readFS == vfs.Default }

// open opens key's block file number gen, of a block of size bytes, for
// reading: directly when direct is set and the block qualifies (see
// Direct reads). A missing file fails with an error wrapping
// tiers.ErrCorrupt.
func (b *blockFiles) open(key index.Key, gen uint64, size int64, direct bool) (readFile, error) {
	if !b.rawReads() {
		f, err := b.readFS.Open(b.path(key, gen))
		if err != nil {
			return readFile{}, openError(key, gen, err)
		}
		return readFile{vf: f}, nil
	}
	if direct && size >= directMin && !b.noDirect.Load() {
		if f, ok, err := b.openDirect(key, gen, size); err != nil {
			return readFile{}, err
		} else if ok {
			return readFile{fd: f, b: b}, nil
		}
	}
	large := size >= directMin
	if !large {
		if f := b.fds.get(gen); f != nil {
			return readFile{fd: f, b: b}, nil
		}
	}
	fd, err := openRaw(b.path(key, gen), 0)
	if err != nil {
		return readFile{}, openError(key, gen, err)
	}
	f := &sharedFD{fd: fd, gen: gen, refs: 1}
	if !large {
		f = b.fds.add(f)
	}
	return readFile{fd: f, b: b}, nil
}

// openDirect opens file gen and, when none of its first size bytes is in
// the page cache, turns O_DIRECT on for the descriptor, which is the
// caller's alone; a file with pages cached is read through them. It
// reports whether it opened the file: when the kernel or the file system
// refuses a direct read, direct reads are turned off and the file is left
// for open to open (false, nil).
func (b *blockFiles) openDirect(key index.Key, gen uint64, size int64) (*sharedFD, bool, error) {
	fd, err := openRaw(b.path(key, gen), 0)
	if err != nil {
		return nil, false, openError(key, gen, err)
	}
	f := &sharedFD{fd: fd, gen: gen, refs: 1}
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &unix.CachestatRange{Len: uint64(size)}, &cs, 0); err != nil {
		b.directOff("cachestat", err)
		_ = unix.Close(fd)
		return nil, false, nil
	}
	if cs.Cache > 0 {
		f.warm = cs.Cache*uint64(pageSize) >= uint64(size)
		return f, true, nil
	}
	// F_SETFL changes only O_APPEND, O_ASYNC, O_DIRECT, O_NOATIME and
	// O_NONBLOCK, none of which the descriptor has.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_DIRECT); err != nil {
		b.directOff("fcntl", err)
		return f, true, nil
	}
	f.direct = true
	b.directReads.Add(1)
	return f, true, nil
}

// directOff turns direct reads off for the tier: the kernel or the file
// system refused one.
func (b *blockFiles) directOff(what string, err error) {
	if !b.noDirect.Swap(true) && b.log != nil {
		b.log.Info("ssd: block files are read through the page cache: direct reads refused",
			"dir", b.dir, "call", what, "err", err)
	}
}

// openRaw opens path for reading with a bare descriptor, with flags added.
func openRaw(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|flags, 0)
		if err != unix.EINTR {
			if err != nil {
				return -1, &os.PathError{Op: "open", Path: path, Err: err}
			}
			return fd, nil
		}
	}
}

func openError(key index.Key, gen uint64, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("payload: %w: block file %s missing", tiers.ErrCorrupt, fileName(key, gen))
	}
	return fmt.Errorf("read payload: %w", err)
}

// willNeed asks the kernel to start reading the first size bytes of f
// into the page cache, without waiting for them; a direct read needs
// nothing of the kind. For a read to come later (GetMany's read ahead)
// that keeps the disk busy meanwhile; right before a pread of the same
// bytes it helps only where the pread alone would not submit them all at
// once (needWillNeed).
func (f readFile) willNeed(size int64) {
	fd := -1
	switch {
	case f.vf != nil:
		if d := f.vf.Fd(); d != vfs.InvalidFd {
			fd = int(d)
		}
	case f.fd != nil && !f.fd.direct:
		fd = f.fd.fd
	}
	if fd >= 0 {
		_ = unix.Fadvise(fd, 0, size, unix.FADV_WILLNEED)
		if f.b != nil {
			f.b.advised.Add(1)
		}
	}
}

// syncReadAhead is the size up to which a block's pread is enough to have
// the kernel read the whole block from the disk at once: a buffered read
// that starts at offset 0 of a file and finds it uncached makes one
// readahead request of at least the bytes asked for, up to the larger of
// the device's read_ahead_kb and its largest request (max_sectors_kb). At
// the default read_ahead_kb, 128 KiB, or any larger, a block of this size
// needs no posix_fadvise(WILLNEED) first: it would only walk the page
// cache once more (a sixth of the CPU of a 64 KiB hit).
const syncReadAhead = 128 << 10

// needWillNeed reports whether a pread of f's first size bytes should be
// preceded by willNeed: the block is larger than syncReadAhead, where the
// kernel's readahead alone may submit it in pieces, each waited for, and
// not known to be in the page cache already (warm), nor read directly.
func (f readFile) needWillNeed(size int64) bool {
	if size <= syncReadAhead {
		return false
	}
	return f.fd == nil || !f.fd.direct && !f.fd.warm
}

// pageSize is the size of a page of the page cache, as cachestat counts.
var pageSize = unix.Getpagesize()

// direct reports whether f reads directly.
func (f readFile) direct() bool { return f.fd != nil && f.fd.direct }

// readAt reads len(p) bytes at offset 0, as io.ReaderAt. A direct file
// reads into p's spare capacity too, up to len(p) rounded up to
// directAlign: p must be aligned with room for it (directFits), or f
// falls back to the page cache.
func (f readFile) readAt(p []byte) (int, error) {
	if f.vf != nil {
		return f.vf.ReadAt(p, 0)
	}
	if f.fd.direct && !directFits(p) {
		f.fd.buffered()
	}
	if f.fd.direct {
		n, err := preadAt(f.fd.fd, p[:roundUp(len(p))], 0, len(p))
		if !errors.Is(err, unix.EINVAL) {
			return min(n, len(p)), err
		}
		f.b.directOff("pread", err)
		f.fd.buffered()
	}
	return preadAt(f.fd.fd, p, 0, len(p))
}

// buffered makes f, opened for direct reads, read through the page
// cache. Only an uncached descriptor is direct, so no other reader shares
// it. The descriptor was opened with no other flag that F_SETFL changes.
func (f *sharedFD) buffered() {
	_, _ = unix.FcntlInt(uintptr(f.fd), unix.F_SETFL, 0)
	f.direct = false
}

// preadAt reads at least need bytes at off in fd into p, up to len(p)
// (a direct read reads whole aligned blocks, and stops at the end of the
// file). Short of need bytes, it returns io.EOF at the end of the file, or
// the error met.
func preadAt(fd int, p []byte, off int64, need int) (int, error) {
	n := 0
	for n < need {
		m, err := unix.Pread(fd, p[n:], off+int64(n))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return n, err
		case m == 0:
			return n, io.EOF
		}
		n += m
	}
	return n, nil
}

// directFits reports whether p can take a direct read of len(p) bytes:
// aligned, with room for the length rounded up.
func directFits(p []byte) bool {
	return len(p) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(p)))%directAlign == 0 &&
		cap(p) >= roundUp(len(p))
}

// roundUp rounds n up to a multiple of directAlign.
func roundUp(n int) int { return (n + directAlign - 1) &^ (directAlign - 1) }

// close releases f; a read of it that failed (failed set) also drops its
// descriptor from the cache.
func (f readFile) close(failed bool) {
	switch {
	case f.vf != nil:
		_ = f.vf.Close()
	case f.fd != nil:
		if failed && f.fd.cached {
			f.b.fds.evict(f.fd.gen)
		}
		f.b.fds.release(f.fd)
	}
}

// isOpen reports whether f holds a file.
func (f readFile) isOpen() bool { return f.vf != nil || f.fd != nil }

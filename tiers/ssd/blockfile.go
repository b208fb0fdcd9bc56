package ssd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// # Block files
//
// A block of Config.FileMinSize bytes or more is written to a file of its
// own, under the store's directory:
//
//	blocks/<hh>/<namespace>-<hash>-<gen>
//
// with hh the low byte of the hash in hex (256 subdirectories, created at
// Open), namespace and hash in 16 hex digits each and gen a decimal number
// that no other block file of the store has had: an overwrite writes a new
// file, so a reader that opened the old one goes on reading it. The
// block's record names gen (record.go); the bytes are exactly the block's,
// from offset 0.
//
// A Put writes the file, then commits the record — the file before it
// takes the key's lock, when the block clearly fits, and removes it if a
// check under the lock then refuses the block: a crash between the two
// leaves a file that no record names, which the next Open removes (sweep).
// The file is synced by the next flush (flushLocked), before Pebble's, so
// that a durable record never names a file whose bytes are not. A file is
// removed only once the deletion of its record is durable — after the next
// flush, or sync of the WAL — so that a crash that brings a deleted or
// replaced record back finds its file too. A file the record names that is
// missing or short, or whose bytes fail the record's checksum, makes the
// block corrupt: it is dropped like a damaged Pebble value.

const (
	// blocksDir is the directory of the block files, inside Config.Dir;
	// Pebble ignores it.
	blocksDir = "blocks"
	// blockCategory is the disk-write category of block files.
	blockCategory vfs.DiskWriteCategory = "kvstrata-block"
	// blockSyncers bounds the block files a flush syncs at once.
	blockSyncers = 8
)

// blockFiles manages the block files of a store. It is safe for
// concurrent use.
type blockFiles struct {
	fs     vfs.FS // the tier's countingFS, for writes
	readFS vfs.FS // Config.FS, for reads (no split: see readBlock)
	dir    string // Config.Dir/blocks

	gen   atomic.Uint64 // the last number given to a file
	bytes atomic.Int64  // bytes of the files on disk, removed ones excepted

	// fds keeps files open for reads (fdcache.go); noDirect turns direct
	// reads off (readfile.go), which directReads counts; advised counts
	// the files asked for ahead of their reads (willNeed).
	fds         *fdCache
	noDirect    atomic.Bool
	directReads atomic.Int64
	advised     atomic.Int64
	log         *slog.Logger

	mu       sync.Mutex
	unsynced []vfs.File // written since the last sync, still open
	dirs     [256]bool  // subdirectories with entries not yet synced
	seq      uint64     // stamp of the next doomed file
	doomed   []doomedFile
}

// doomedFile is a file to remove once the deletion of its record, stamped
// seq, is durable.
type doomedFile struct {
	path string
	size int64
	seq  uint64
}

func newBlockFiles(fs, readFS vfs.FS, dir string, openFiles int, log *slog.Logger) (*blockFiles, error) {
	b := &blockFiles{fs: fs, readFS: readFS, dir: fs.PathJoin(dir, blocksDir),
		fds: newFDCache(openFiles), log: log}
	for i := range 256 {
		if err := fs.MkdirAll(b.sub(byte(i)), 0o755); err != nil {
			return nil, fmt.Errorf("create block file directory: %w", err)
		}
	}
	if err := syncDir(fs, b.dir); err != nil {
		return nil, fmt.Errorf("sync block file directory: %w", err)
	}
	if err := syncDir(fs, dir); err != nil {
		return nil, fmt.Errorf("sync store directory: %w", err)
	}
	return b, nil
}

// sub is the path of the subdirectory of hash byte h.
func (b *blockFiles) sub(h byte) string { return b.fs.PathJoin(b.dir, fmt.Sprintf("%02x", h)) }

// path is the path of key's block file number gen.
func (b *blockFiles) path(key index.Key, gen uint64) string {
	return b.fs.PathJoin(b.sub(byte(key.Hash)), fileName(key, gen))
}

func fileName(key index.Key, gen uint64) string {
	return fmt.Sprintf("%016x-%016x-%d", uint64(key.NS), uint64(key.Hash), gen)
}

// parseFileName is the inverse of fileName.
func parseFileName(name string) (index.Key, uint64, bool) {
	parts := strings.Split(name, "-")
	if len(parts) != 3 || len(parts[0]) != 16 || len(parts[1]) != 16 {
		return index.Key{}, 0, false
	}
	ns, err1 := strconv.ParseUint(parts[0], 16, 64)
	h, err2 := strconv.ParseUint(parts[1], 16, 64)
	gen, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || gen == 0 {
		return index.Key{}, 0, false
	}
	return index.Key{NS: index.NamespaceID(ns), Hash: index.Hash(h)}, gen, true
}

// write writes value to a new block file of key and returns its number.
// The file stays open until the next sync.
func (b *blockFiles) write(key index.Key, value []byte) (uint64, error) {
	gen := b.gen.Add(1)
	path := b.path(key, gen)
	f, err := b.fs.Create(path, blockCategory)
	if err != nil {
		return 0, fmt.Errorf("create block file: %w", err)
	}
	if _, err := f.Write(value); err != nil {
		_ = f.Close()
		_ = b.fs.Remove(path)
		return 0, fmt.Errorf("write block file: %w", err)
	}
	b.bytes.Add(int64(len(value)))
	b.mu.Lock()
	b.unsynced = append(b.unsynced, f)
	b.dirs[byte(key.Hash)] = true
	b.mu.Unlock()
	return gen, nil
}

// noteGen records that a record names file number gen, so that no new
// file takes that number.
func (b *blockFiles) noteGen(gen uint64) {
	for {
		cur := b.gen.Load()
		if gen <= cur || b.gen.CompareAndSwap(cur, gen) {
			return
		}
	}
}

// read reads the block that m describes, kept in file gen, into p
// (len(p) == m.Size) and checks it against m. It opens the file afresh,
// through the page cache, as a check of the file on disk must.
func (b *blockFiles) read(m index.Header, gen uint64, p []byte) error {
	var f readFile
	if b.rawReads() {
		fd, err := openRaw(b.path(m.Key, gen), 0)
		if err != nil {
			return openError(m.Key, gen, err)
		}
		f = readFile{fd: &sharedFD{fd: fd, gen: gen, refs: 1}, b: b}
	} else {
		vf, err := b.readFS.Open(b.path(m.Key, gen))
		if err != nil {
			return openError(m.Key, gen, err)
		}
		f = readFile{vf: vf}
	}
	if f.needWillNeed(int64(len(p))) {
		f.willNeed(int64(len(p)))
	}
	err := readBlock(f, m, gen, p)
	f.close(err != nil)
	return err
}

// readBlock reads the block that m describes from f, its file number
// gen, into p and checks it against m's size and checksum. A direct f
// also writes p's spare capacity, up to len(p) rounded up (readAt).
//
// The caller has asked the kernel for the whole block at once (willNeed),
// which submits every piece of it to the disk without waiting, or knows
// that the pread does as much (needWillNeed), or reads it directly;
// readBlock then reads it with one pread: the disk works on the whole
// block in parallel whatever the kernel's readahead settings, with no
// goroutine per piece (the split of readsplit.go, which Pebble's reads
// need, adds nothing here).
func readBlock(f readFile, m index.Header, gen uint64, p []byte) error {
	n, err := f.readAt(p)
	if n < len(p) {
		if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("payload: %w: block file %s is short: %d bytes read, record says %d",
				tiers.ErrCorrupt, fileName(m.Key, gen), n, m.Size)
		}
		return fmt.Errorf("read payload: %w", err)
	}
	if sum := index.Checksum(p); sum != m.Sum {
		return fmt.Errorf("payload: %w: block file %s checksum %016x, record says %016x",
			tiers.ErrCorrupt, fileName(m.Key, gen), sum, m.Sum)
	}
	return nil
}

// doom queues key's file gen, of size bytes, for removal once the
// deletion of its record that was just applied is durable.
func (b *blockFiles) doom(key index.Key, gen uint64, size int64) {
	b.fds.evict(gen)
	b.mu.Lock()
	b.doomed = append(b.doomed, doomedFile{path: b.path(key, gen), size: size, seq: b.seq})
	b.seq++
	b.mu.Unlock()
}

// discard removes key's file gen, of size bytes, which no record names.
func (b *blockFiles) discard(key index.Key, gen uint64, size int64) {
	b.fds.evict(gen)
	if err := b.fs.Remove(b.path(key, gen)); err == nil {
		b.bytes.Add(-size)
	}
}

// stamp returns the stamp below which the files were doomed by deletions
// already applied: a flush or WAL sync that starts after the call makes
// those deletions durable.
func (b *blockFiles) stamp() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}

// pendingRemovals reports whether files wait for their removal.
func (b *blockFiles) pendingRemovals() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.doomed) > 0
}

// sync syncs the files written, and the directories that got entries,
// since the last sync, and closes the files. A file whose sync fails
// stays for the next sync to try again.
func (b *blockFiles) sync() error {
	b.mu.Lock()
	files := b.unsynced
	b.unsynced = nil
	var dirs []byte
	for i, d := range b.dirs {
		if d {
			dirs = append(dirs, byte(i))
			b.dirs[i] = false
		}
	}
	b.mu.Unlock()
	if len(files) == 0 && len(dirs) == 0 {
		return nil
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range min(blockSyncers, len(files)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(files); i = int(next.Add(1) - 1) {
				errs[i] = files[i].Sync()
			}
		}()
	}
	wg.Wait()
	var failed []vfs.File
	var err error
	for i, f := range files {
		if errs[i] != nil {
			failed = append(failed, f)
			err = errs[i]
			continue
		}
		_ = f.Close()
	}
	for _, d := range dirs {
		if derr := syncDir(b.fs, b.sub(d)); derr != nil {
			err = derr
			b.mu.Lock()
			b.dirs[d] = true
			b.mu.Unlock()
		}
	}
	if len(failed) > 0 {
		b.mu.Lock()
		b.unsynced = append(b.unsynced, failed...)
		b.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("sync block files: %w", err)
	}
	return nil
}

// removeDoomed removes the files doomed by deletions stamped below upTo,
// which are durable now.
func (b *blockFiles) removeDoomed(upTo uint64) error {
	b.mu.Lock()
	var now []doomedFile
	keep := b.doomed[:0]
	for _, d := range b.doomed {
		if d.seq < upTo {
			now = append(now, d)
		} else {
			keep = append(keep, d)
		}
	}
	b.doomed = keep
	b.mu.Unlock()
	var errs []error
	for _, d := range now {
		err := b.fs.Remove(d.path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if err == nil {
			b.bytes.Add(-d.size)
		}
	}
	return errors.Join(errs...)
}

// closeFiles closes the files not yet synced, unsynced, and the files
// kept open for reads.
func (b *blockFiles) closeFiles() {
	b.fds.close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.unsynced {
		_ = f.Close()
	}
	b.unsynced = nil
}

// sweep removes the block files that no record names — written before a
// crash that lost their record, or whose deletion became durable just
// before one — and the files of removed blocks still waiting, and sets the
// next file number above every number in use or on disk. maxGen is the
// largest number the records name (noteGen). It runs in Open, after
// load.
func (t *Tier) sweep() error {
	b := t.files
	maxGen := b.gen.Load()
	var removed, kept int
	var bytes int64
	for i := range 256 {
		sub := b.sub(byte(i))
		names, err := b.fs.List(sub)
		if err != nil {
			return fmt.Errorf("sweep block files: %w", err)
		}
		dirty := false
		for _, name := range names {
			path := b.fs.PathJoin(sub, name)
			key, gen, ok := parseFileName(name)
			if ok {
				maxGen = max(maxGen, gen)
				if m, rgen, err := t.record(key); err == nil && rgen == gen {
					bytes += int64(m.Size)
					kept++
					continue
				}
			}
			if err := b.fs.RemoveAll(path); err != nil {
				return fmt.Errorf("sweep block files: %w", err)
			}
			removed++
			dirty = true
		}
		if dirty {
			if err := syncDir(b.fs, sub); err != nil {
				return fmt.Errorf("sweep block files: %w", err)
			}
		}
	}
	b.gen.Store(maxGen)
	b.bytes.Store(bytes)
	if removed > 0 {
		t.cfg.Logger.Info("ssd: removed block files that no record names", "dir", t.cfg.Dir,
			"removed", removed, "kept", kept)
	}
	return nil
}

// LocateFile returns where key's block lies when it is kept in a block
// file (tiers.FileLocator): the whole file, from offset 0, open until the
// extent is released — the block may be deleted or replaced meanwhile,
// the open file keeps its bytes. A block kept inline, below FileMinSize,
// fails with tiers.ErrNotFound; otherwise LocateFile fails as Get does
// (a block whose file is missing is dropped, as corrupt). The bytes are
// not checked: the reader checks them against the extent's Meta.
func (t *Tier) LocateFile(key index.Key) (tiers.FileExtent, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil, fmt.Errorf("ssd: locate file %v: %w", key, tiers.ErrClosed)
	}
	s := t.stripe(key)
	s.RLock()
	m, gen, err := t.record(key)
	var f vfs.File
	switch {
	case err != nil:
	case gen == 0:
		err = fmt.Errorf("%w: the block is kept inline, not in a file", tiers.ErrNotFound)
	default:
		if f, err = t.files.readFS.Open(t.files.path(key, gen)); err != nil {
			err = openError(key, gen, err)
		}
	}
	s.RUnlock()
	if err != nil {
		t.dropIfCorrupt(key, err)
		return nil, fmt.Errorf("ssd: locate file %v: %w", key, err)
	}
	return &fileExtent{f: f, m: m}, nil
}

// fileExtent is a tiers.FileExtent on an open block file.
type fileExtent struct {
	f    vfs.File
	m    index.Header
	once sync.Once
}

func (e *fileExtent) File() tiers.BlockFile { return e.f }
func (e *fileExtent) Offset() int64         { return 0 }
func (e *fileExtent) Meta() index.Header    { return e.m }

// Release closes the file; later calls do nothing.
func (e *fileExtent) Release() error {
	var err error
	e.once.Do(func() { err = e.f.Close() })
	return err
}

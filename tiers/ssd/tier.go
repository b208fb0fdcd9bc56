// Package ssd is the local-SSD tier: a tiers.Tier that keeps blocks on a
// local disk, each large block in a file of its own and the small ones,
// with every block's metadata, in a Pebble store. Pebble uses value
// separation, so that the bytes of inline blocks are written once into
// blob files, which compactions do not rewrite (only a blob file mostly
// made of deleted blocks is rewritten, to reclaim its space).
//
// # On-disk layout
//
// Config.Dir holds the Pebble store and the directory blocks/ of block
// files. Each block has a metadata record in Pebble:
//
//	'm' ‖ namespace ‖ hash  →  metadata record (record.go, 50 bytes)
//
// with namespace and hash big-endian. The record holds the block's size,
// parent and xxhash64 checksum (index.Header), and the number of its block
// file, and checks itself with a checksum of its own. A block of at least
// Config.FileMinSize bytes (64 KiB by default) is written to a file of its
// own before its record is committed:
//
//	blocks/<hh>/<namespace>-<hash>-<number>
//
// hh being the hash's low byte in hex, and number one that no other file
// of the store has had, so that an overwrite never reuses the name of a
// file a reader may have open (blockfile.go). A smaller block is a second
// Pebble key, written with the record in one batch so that a crash keeps
// both or neither:
//
//	'p' ‖ namespace ‖ hash  →  the block's bytes, as put
//
// Records are small, so they stay inside the sstables, where Stat, Scan
// and the accounting that Open rebuilds read them without touching the
// payloads, which Pebble moves into blob files
// (Config.ValueSeparationMinSize). One more key, "\x00kvstrata/ssd",
// marks the store's format version, 2. Open takes a store of format 1,
// which had no block files, over as it is: its records (version 1) read as
// inline blocks, which block files replace as they are put again; it
// refuses a store of any other format, naming the directory.
//
// Pebble sizes its levels and output files by the bytes their keys
// reference in blob files; its defaults, made for small values, would split
// a flush of inline blocks into files of two blocks each. The tier sets the
// file size so that a flush writes one sstable and one blob file, and a
// large base level so that compactions, which move only the small
// sstables, stay rare (pebble.go).
//
// Get checks the block's bytes against the record's size and checksum. A
// block that fails — its bytes damaged, its value or its file missing or
// short — or whose record fails its own checks, is deleted and reported as
// an error wrapping tiers.ErrCorrupt: damaged bytes are never returned.
//
// # Reads
//
// Get opens a block's file under the key's lock and reads it with one
// pread straight into the caller's buffer, then checks it. A block of
// 512 KiB or more none of whose pages is in the page cache is read with
// O_DIRECT, from the disk into the buffer, when the buffer allows; any
// other is read through the page cache. A block over 128 KiB not known to
// be cached whole is first asked for whole (posix_fadvise WILLNEED, which
// submits all of it to the disk); the pread of a smaller one does as much
// by itself. When Config.FS is the operating system's, block files are
// read through bare descriptors, and small blocks' files are kept open
// for the next read, up to Config.OpenFiles (readfile.go, fdcache.go).
// The records of blocks read or written lately are kept in memory, up to
// Config.RecordCache, so that a read seldom looks its block's record up
// in Pebble (recordcache.go). GetMany — how the hierarchy's ReadMany, and
// so a node's get of a context, reads a chain — opens the chain's block
// files in order, each once, and asks the kernel for each whole file it
// reads through the page cache as it opens it, up to Config.ReadAhead
// bytes ahead of the reads done, while Config.ReadWindow reads copy the
// blocks out of the files so opened, or read them directly. A file stays
// readable once open, whatever happens to its key: LocateFile
// (tiers.FileLocator) hands one out, with its descriptor, for a reader
// with its own path to the disk (GPUDirect Storage).
//
// Pebble reads an inline block's bytes from its blob file with one
// synchronous read, kernel readahead off; a large one is split into pieces
// read in parallel (readsplit.go).
//
// # Durability
//
// Config.Durability chooses between DurabilityFlush (the default: Pebble
// without its write-ahead log, memtables flushed every
// Config.FlushInterval, on Flush and on Close) and DurabilityWAL (a WAL
// written without fsync). After a crash in either mode every block is
// intact or missing, never torn; what each mode may lose is documented on
// the constants. Every flush first syncs the block files written since the
// last one (and their directories), so that a record made durable names a
// durable file; a file whose record is lost in a crash is removed by the
// next Open. A block file is removed only once the deletion of its record
// is durable — after the next flush, or in DurabilityWAL mode the next sync
// of the WAL, which the background loop does every FlushInterval while
// files wait — so that a crash that brings a deleted or replaced record
// back finds its file. (After a power loss, a record whose file's bytes
// never reached the disk fails its checksum: the block reads as corrupt
// and is dropped.) Flush makes every acknowledged write durable on demand,
// and Invalidate (invalidate.go) is a Delete that is durable when it
// returns, with the syncs of concurrent calls shared: what the hierarchy
// uses to drop the older copy of a key it has just replaced.
//
// # Accounting
//
// Stats.Used is the sum over blocks of size + RecordOverhead, kept in
// memory and rebuilt at Open by scanning the metadata records. Capacity
// bounds Used; Pebble's own space amplification, and the files of deleted
// blocks until the next flush removes them, come on top (DiskUsage).
//
// # Disk space
//
// The tier keeps within its file system (space.go): a Put that would leave
// less free space than Config.DiskReserve, counting the bytes not yet
// flushed, is refused with an error wrapping tiers.ErrNoSpace, and so is
// every Put after one of its writes (Pebble's, or of a block file) failed
// with ENOSPC, until space returns. Meanwhile Degraded says why,
// Stats.Capacity is what the file system lets the tier hold, Flush and
// Close do not wait for a flush that fails for space, and Pebble leaves no
// empty output files behind. Open warns when Capacity exceeds what the
// file system has room for. Block files are written through Config.FS like
// Pebble's files, so the same accounting and fault tracking see them.
//
// # Disk faults
//
// A write of Pebble's or of a block file that fails with an I/O error
// (fault.go) makes the tier
// refuse puts with ErrWriteFailing and report itself degraded until a
// flush succeeds; Flush and Close report the failure rather than wait, and
// Pebble's retries are paced. A read that fails is an error, and the block
// stays. Pebble v2.1.7 treats a failed write or sync of its write-ahead log
// or its MANIFEST as fatal (Logger.Fatalf, which the tier turns into a
// panic), and crashes on a failed sync of a blob file (a nil dereference
// in its own code); those end the process.
//
// # Concurrency
//
// A Tier is safe for concurrent use. Operations on one key are serialized
// by a striped lock (Put, Delete and the dropping of a corrupt block take
// it exclusively, Get and Stat shared, so a Get always sees the record and
// the payload of the same Put; a Get holds it until it has the block's
// file open, not while it reads; a Put writes a block file, under a new
// number, before it takes the lock, when the block clearly fits, so that
// the key's readers do not wait for the file system); operations on
// different keys run in parallel, as Pebble allows. Scan reads records a page at a time and holds
// no lock while it calls fn, so fn may call the tier. Close waits for
// operations in flight.
package ssd

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// The tiers.Tier extras an SSD tier implements (see tiers/extras.go).
var (
	_ tiers.Tier                = (*Tier)(nil)
	_ tiers.Invalidator         = (*Tier)(nil)
	_ tiers.ManyGetter          = (*Tier)(nil)
	_ tiers.DegradationReporter = (*Tier)(nil)
	_ tiers.FileLocator         = (*Tier)(nil)
)

// stripeCount is the number of key locks; a power of two.
const stripeCount = 64

// Tier is the local-SSD tier. Open it with Open.
type Tier struct {
	cfg Config
	db  *pebble.DB
	fs  *countingFS
	// space keeps the tier within its file system's free space (space.go).
	space *space
	// faults tracks writes that failed with an I/O error (fault.go).
	faults *writeFaults
	// files keeps the blocks of FileMinSize bytes or more (blockfile.go).
	files *blockFiles

	// life guards closed and with it the use of db: every method holds it
	// shared while it uses db, Close exclusively.
	life   sync.RWMutex
	closed bool

	stripes [stripeCount]sync.RWMutex
	// recs keeps the records read or written lately (recordcache.go).
	recs    *recordCache
	acct    accounting
	batches sync.Pool // of *pebble.Batch, reset, sized for a block
	// bufs lends the buffers GetManyPooled reads blocks into.
	bufs *bufpool.Pool

	logical atomic.Int64 // bytes of blocks put since Open
	dirty   atomic.Bool  // written since the last flush began
	flushMu sync.Mutex   // one flush at a time (flushLocked)
	// lastFlush is the done channel of the last flush started (flushWait).
	lastFlush atomic.Pointer[<-chan struct{}]
	dels      deletions // deletes not yet durable (invalidate.go)
	inval     *invalLog
	stop      chan struct{}
	done      chan struct{}
}

// Open opens the tier stored in cfg.Dir, creating it if needed, and
// rebuilds its accounting from the metadata records; records that fail
// their checks are deleted with their blocks. A store holding more than
// cfg.Capacity (reopened with a smaller capacity, say) opens, and refuses
// puts until deletes bring it under.
func Open(cfg Config) (*Tier, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.FS.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	sp := newSpace(&cfg)
	wf := &writeFaults{dir: cfg.Dir, log: cfg.Logger}
	fs := &countingFS{FS: cfg.FS, space: sp, faults: wf}
	db, err := pebble.Open(cfg.Dir, pebbleOptions(&cfg, fs, sp, wf))
	if err != nil {
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	t := &Tier{
		cfg:    cfg,
		db:     db,
		fs:     fs,
		space:  sp,
		faults: wf,
		recs:   newRecordCache(cfg.RecordCache),
		acct:   accounting{capacity: cfg.Capacity},
		bufs:   bufpool.New(pooledIdle),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	retain := pebble.WithMaxRetainedSizeBytes(int(batchSize(cfg.MaxBlockSize)))
	t.batches.New = func() any { return db.NewBatch(retain) }
	if err := t.checkFormat(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	if t.files, err = newBlockFiles(fs, cfg.FS, cfg.Dir, cfg.OpenFiles, cfg.Logger); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	next, err := t.replayInvalidations()
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	t.inval = newInvalLog(cfg.FS, cfg.Dir, next)
	if err := t.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	if err := t.sweep(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("ssd: open %s: %w", cfg.Dir, err)
	}
	if s := t.acct.stats(); s.Used > s.Capacity {
		cfg.Logger.Warn("ssd: store holds more than its capacity", "dir", cfg.Dir,
			"used", s.Used, "capacity", s.Capacity)
	}
	sp.sample(t.diskUsage())
	if fits := sp.capacity(cfg.Capacity); fits < cfg.Capacity {
		cfg.Logger.Warn("ssd: capacity exceeds what the file system has room for; the tier will hold less and refuse puts once the file system fills",
			"dir", cfg.Dir, "capacity", units.FormatBytes(cfg.Capacity), "room", units.FormatBytes(fits),
			"free", units.FormatBytes(sp.avail.Load()), "reserve", units.FormatBytes(sp.reserve))
	}
	go t.loop()
	return t, nil
}

// Put stores value under m.Key, replacing any block there; see tiers.Tier.
func (t *Tier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, t.cfg.MaxBlockSize); err != nil {
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return fmt.Errorf("ssd: put %v: %w", m.Key, tiers.ErrClosed)
	}
	// A block file is written before the key's lock is taken, when the
	// block clearly fits: its number is new, so no one meets the file until
	// the record names it, and the key's readers do not wait for the file
	// system (a create can wait for a journal commit that syncs elsewhere
	// hold up). The checks are made again under the lock; one that fails
	// there removes the file.
	var gen uint64 // the block's file, written ahead
	if int64(len(value)) >= t.cfg.FileMinSize && t.acct.fits(cost(m.Size)) &&
		t.faults.failing() == nil && t.space.check(cost(m.Size)) == nil {
		var err error
		if gen, err = t.writeFile(m.Key, value); err != nil {
			return fmt.Errorf("ssd: put %v: %w", m.Key, err)
		}
	}
	discard := func() {
		if gen != 0 {
			t.files.discard(m.Key, gen, int64(len(value)))
		}
	}
	s := t.stripe(m.Key)
	s.Lock()
	old, oldGen, err := t.record(m.Key)
	if errors.Is(err, tiers.ErrCorrupt) {
		// The old block's cost is unknown: drop it, which recounts.
		s.Unlock()
		if err := t.drop(m.Key); err != nil {
			discard()
			return fmt.Errorf("ssd: put %v: %w", m.Key, err)
		}
		s.Lock()
		old, oldGen, err = t.record(m.Key)
	}
	defer s.Unlock()
	var oldCost, oldBlocks int64
	switch {
	case err == nil:
		oldCost, oldBlocks = cost(old.Size), 1
	case !errors.Is(err, tiers.ErrNotFound):
		discard()
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	if err := t.faults.failing(); err != nil {
		discard()
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	bytes, blocks := cost(m.Size)-oldCost, 1-oldBlocks
	if err := t.acct.reserve(bytes, blocks); err != nil {
		discard()
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	// A replaced block's bytes stay on disk until Pebble reclaims them: the
	// new ones need room of their own.
	if err := t.space.check(cost(m.Size)); err != nil {
		t.acct.release(bytes, blocks)
		discard()
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	inFile, err := t.write(m, value, gen, oldBlocks == 1 && oldGen == 0)
	if err != nil {
		t.acct.release(bytes, blocks)
		return fmt.Errorf("ssd: put %v: %w", m.Key, err)
	}
	if oldGen != 0 {
		t.files.doom(m.Key, oldGen, int64(old.Size))
	}
	if inFile {
		// The file's bytes are on the file system already.
		t.space.unflushed.Add(RecordOverhead)
	} else {
		t.space.unflushed.Add(cost(m.Size))
	}
	t.logical.Add(int64(len(value)))
	t.dirty.Store(true)
	return nil
}

// batchSize is the size of a batch that puts a block of size bytes,
// with room for the batch's header and per-entry encoding.
func batchSize(size int64) int64 { return size + 2*(keySize+16) + recordSize + 16 }

// writeFile writes value to a new block file of key and returns its
// number, or an error wrapping tiers.ErrNoSpace or ErrWriteFailing.
func (t *Tier) writeFile(key index.Key, value []byte) (uint64, error) {
	gen, err := t.files.write(key, value)
	if err != nil {
		// The tier's FS has told space or faults (countingFS), so that
		// the next puts are refused as this one.
		if isNoSpace(err) {
			return 0, fmt.Errorf("%w: %w", tiers.ErrNoSpace, err)
		}
		return 0, fmt.Errorf("%w: %w", ErrWriteFailing, err)
	}
	return gen, nil
}

// write stores m's block: a block of Config.FileMinSize bytes or more in
// a new block file (file gen, when the caller wrote it already), then its
// record; a smaller one as its record and value, in one batch. Batches are
// pooled with their buffers, so that a Put does not allocate a block-sized
// buffer for the garbage collector to clear. oldInline says the block
// replaced is kept inline: its value is deleted with the new record when
// the new block goes to a file. write reports whether the block went to a
// file; on error no file of the block is left.
func (t *Tier) write(m index.Header, value []byte, gen uint64, oldInline bool) (inFile bool, err error) {
	if gen == 0 && int64(len(value)) >= t.cfg.FileMinSize {
		if gen, err = t.writeFile(m.Key, value); err != nil {
			return false, err
		}
	}
	rk, pk := makeKey(prefixRecord, m.Key), makeKey(prefixPayload, m.Key)
	var rec [recordSize]byte
	b := t.batches.Get().(*pebble.Batch)
	defer func() {
		b.Reset()
		t.batches.Put(b)
	}()
	err = b.Set(rk[:], encodeRecord(rec[:0], m, gen), nil)
	switch {
	case err != nil:
	case gen == 0:
		err = b.Set(pk[:], value, nil)
	case oldInline:
		err = b.Delete(pk[:], nil)
	}
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	if err != nil {
		// The record may or may not have been applied.
		t.recs.forget(m.Key)
	} else {
		t.recs.put(m, gen)
	}
	if err != nil && gen != 0 {
		// No record names the file: remove it now (or the next Open does).
		t.files.discard(m.Key, gen, int64(len(value)))
	}
	return gen != 0, err
}

// Get appends the block's bytes to dst after checking them against the
// block's record; see tiers.Tier. A block that fails is deleted and Get
// returns nil and an error wrapping tiers.ErrCorrupt.
func (t *Tier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", key, tiers.ErrClosed)
	}
	return t.get(key, dst)
}

// get is Get for a caller that holds t.life shared. A block in a file is
// read straight into dst's spare capacity, grown as needed.
func (t *Tier) get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	b, err := t.locate(key, false)
	if err == nil {
		n, end := len(dst), len(dst)+int(b.m.Size)
		dst = slices.Grow(dst, int(b.m.Size))[:end]
		// The caller's spare capacity past the block is not the tier's to
		// write (a direct read rounds up).
		err = b.readInto(dst[n:end:end])
		b.close(err)
	}
	if err != nil {
		t.dropIfCorrupt(key, err)
		return nil, index.Header{}, fmt.Errorf("ssd: get %v: %w", key, err)
	}
	return dst, b.m, nil
}

// located is a block found by locate: its record, and its file open or its
// inline bytes, checked.
type located struct {
	m      index.Header
	gen    uint64
	f      readFile  // the block's file, when gen != 0
	v      []byte    // the inline bytes, when gen == 0
	closer io.Closer // of v
}

// locate reads key's record under the key's lock and opens the block's
// file, or reads and checks its inline bytes: once open, the file stays
// readable whatever happens to the key. A large block's file is opened
// for a direct read when the block is a whole number of directAlign
// blocks, or when the caller reads into the tier's own buffer (own), with
// room for the rounding. The caller holds t.life shared, and closes the
// result.
func (t *Tier) locate(key index.Key, own bool) (located, error) {
	s := t.stripe(key)
	s.RLock()
	defer s.RUnlock()
	var b located
	var err error
	b.m, b.gen, err = t.record(key)
	switch {
	case err != nil:
	case b.gen != 0:
		direct := own || b.m.Size%directAlign == 0
		b.f, err = t.files.open(key, b.gen, int64(b.m.Size), direct)
	default:
		b.v, b.closer, err = t.payload(b.m)
	}
	return b, err
}

// readInto reads the block into p, len(p) == m.Size, and checks a block
// read from its file.
func (b *located) readInto(p []byte) error {
	if b.f.isOpen() {
		if b.f.needWillNeed(int64(len(p))) {
			b.f.willNeed(int64(len(p)))
		}
		return readBlock(b.f, b.m, b.gen, p)
	}
	copy(p, b.v)
	return nil
}

// close closes b's file or releases its inline bytes; err is the read's
// error, nil when it succeeded.
func (b *located) close(err error) {
	if b.f.isOpen() {
		b.f.close(err != nil)
	}
	if b.closer != nil {
		_ = b.closer.Close()
	}
}

// Stat returns the block's Meta from its record, without reading its
// bytes.
func (t *Tier) Stat(key index.Key) (index.Header, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return index.Header{}, fmt.Errorf("ssd: stat %v: %w", key, tiers.ErrClosed)
	}
	s := t.stripe(key)
	s.RLock()
	m, _, err := t.record(key)
	s.RUnlock()
	if err != nil {
		t.dropIfCorrupt(key, err)
		return index.Header{}, fmt.Errorf("ssd: stat %v: %w", key, err)
	}
	return m, nil
}

// Delete removes the block; a block whose record is corrupt is deleted
// too.
func (t *Tier) Delete(key index.Key) error {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return fmt.Errorf("ssd: delete %v: %w", key, tiers.ErrClosed)
	}
	s := t.stripe(key)
	s.Lock()
	m, gen, err := t.record(key)
	if errors.Is(err, tiers.ErrCorrupt) {
		s.Unlock()
		if err := t.drop(key); err != nil {
			return fmt.Errorf("ssd: delete %v: %w", key, err)
		}
		return nil
	}
	defer s.Unlock()
	if err != nil {
		return fmt.Errorf("ssd: delete %v: %w", key, err)
	}
	if err := t.deleteKeys(key, gen, m.Size); err != nil {
		return fmt.Errorf("ssd: delete %v: %w", key, err)
	}
	t.acct.release(cost(m.Size), 1)
	return nil
}

// Stats returns the tier's accounting. Used may briefly include a Put in
// flight, whose bytes are reserved before its batch commits. Capacity is
// Config.Capacity, or less when the file system has no room for that much
// (what the store takes on disk now plus the free space, less
// Config.DiskReserve, as sampled every FlushInterval).
func (t *Tier) Stats() tiers.Stats {
	s := t.acct.stats()
	s.Capacity = t.space.capacity(s.Capacity)
	return s
}

// Degraded returns why the tier refuses puts for now although it can be
// read — its file system is full: a write failed with ENOSPC, or there is
// no room for a block of the largest size beside Config.DiskReserve; or a
// write failed with an I/O error (ErrWriteFailing, fault.go) — or nil. The
// tier recovers by itself once space returns, or a flush succeeds.
func (t *Tier) Degraded() error {
	if err := t.space.degraded(); err != nil {
		return fmt.Errorf("ssd: %w", err)
	}
	return t.faults.failing()
}

// Flush makes every write acknowledged so far durable: it flushes Pebble's
// memtable to sstables and blob files, which Pebble syncs. While the file
// system is full it fails, with an error wrapping tiers.ErrNoSpace, rather
// than wait for space; Pebble keeps trying to flush.
func (t *Tier) Flush() error {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return fmt.Errorf("ssd: flush %s: %w", t.cfg.Dir, tiers.ErrClosed)
	}
	t.dirty.Store(false)
	if err := t.flushLocked(); err != nil {
		t.dirty.Store(true)
		return fmt.Errorf("ssd: flush %s: %w", t.cfg.Dir, err)
	}
	return nil
}

// flushWait flushes the memtable and waits until the flush is done, fails
// for want of space, or a write fails with an I/O error.
func (t *Tier) flushWait() error {
	_ = t.space.check(0) // clears a failure once space is back
	if err := t.space.failing(); err != nil {
		return fmt.Errorf("%w: %v", tiers.ErrNoSpace, err)
	}
	start := time.Now()
	done, err := t.db.AsyncFlush()
	if err != nil {
		return err
	}
	t.lastFlush.Store(&done)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-tick.C:
			if err := t.space.failing(); err != nil {
				return fmt.Errorf("%w: %v", tiers.ErrNoSpace, err)
			}
			if err := t.faults.failedSince(start); err != nil {
				return err
			}
		}
	}
}

// flushPending reports whether the last flush has not finished: one that
// stopped waiting for want of space is still queued in Pebble, and another
// behind it would only queue one more memtable.
func (t *Tier) flushPending() bool {
	done := t.lastFlush.Load()
	if done == nil {
		return false
	}
	select {
	case <-*done:
		return false
	default:
		return true
	}
}

// WriteStats returns the bytes written since Open; the zero value after
// Close.
func (t *Tier) WriteStats() WriteStats {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return WriteStats{}
	}
	ws := t.fs.writeStats()
	ws.LogicalBytes = t.logical.Load()
	total := t.db.Metrics().Total()
	ws.PebbleWriteAmp = total.WriteAmp()
	return ws
}

// DiskUsage returns the bytes the store takes on disk, which Stats.Used
// does not bound: deleted blocks keep their space until compactions drop
// their keys and their blob file is deleted or rewritten. Pebble rewrites
// blob files (those at least 10 minutes old) once deleted blocks are more
// than half of all blob bytes, so under steady eviction the store may take
// about twice Used. It returns 0 after Close.
func (t *Tier) DiskUsage() int64 {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return 0
	}
	return t.diskUsage()
}

// diskUsage is DiskUsage for a caller that holds t.life, or the
// background loop: Pebble's files and the block files.
func (t *Tier) diskUsage() int64 {
	return int64(t.db.Metrics().DiskSpaceUsage()) + t.files.bytes.Load()
}

// Close flushes the memtable and closes the store, after the operations
// in flight finish. Later calls of every method fail with tiers.ErrClosed;
// a second Close returns nil.
func (t *Tier) Close() error {
	t.life.Lock()
	defer t.life.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	close(t.stop)
	<-t.done
	var errs []error
	if err := t.flushLocked(); err != nil {
		// The puts since the last flush are lost, as in a crash.
		errs = append(errs, fmt.Errorf("flush: %w", err))
	}
	t.inval.close()
	t.files.closeFiles()
	if err := t.db.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ssd: close %s: %w", t.cfg.Dir, err)
	}
	return nil
}

// stripe returns the lock of key.
func (t *Tier) stripe(key index.Key) *sync.RWMutex {
	return &t.stripes[stripeHash(key)%stripeCount]
}

// stripeHash is the hash of key that picks its stripe, modulo
// stripeCount.
func stripeHash(key index.Key) uint64 {
	return uint64(key.Hash) ^ uint64(key.NS) ^ uint64(key.Hash)>>32
}

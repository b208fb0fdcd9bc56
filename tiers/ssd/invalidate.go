package ssd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// # Invalidations
//
// A Delete is no more durable than a Put: without a WAL it survives a
// crash only once the memtable holding it is flushed. That is harmless for
// an eviction, whose block is current, but not for the old version of a
// key a faster tier has just replaced: after a crash it would be read
// again in place of the acknowledged new one. Invalidate (tiers.Invalidator)
// is the delete for that case; it returns once the deletion, and every
// earlier one of the key, survives a crash:
//
//   - In DurabilityWAL mode it commits the deletion with a synced WAL
//     write, which Pebble group-commits with concurrent ones.
//   - In DurabilityFlush mode it deletes the block as Delete does and
//     appends the key to a small log of its own, kvstrata-invalidated-<n>
//     in the store's directory, synced (fdatasync) before it returns;
//     concurrent calls share one write and one sync. Open deletes every
//     key the logs name, flushes, and removes the logs. Each flush of the
//     memtable starts a new log and removes the older ones once it has
//     made their deletions durable, so the log holds about one
//     FlushInterval of invalidations. A key invalidated, then put again and
//     flushed just before a crash may read as missing after it; never as
//     its old block.
//
// The tier remembers, in memory, the keys whose deletion is not yet known
// to be durable (deleted since the last flush, or sync of the WAL), so
// that MayResurrect answers without a read; a Put of a key the tier never
// held lately costs the caller one map lookup.

// invalidatedPrefix starts the name of every invalidation log; Pebble
// ignores files whose names it does not know.
const invalidatedPrefix = "kvstrata-invalidated-"

// invalRecordSize is one log record: namespace and hash (little-endian),
// then xxhash64 of those 16 bytes, so that a torn last record is ignored.
const invalRecordSize = 24

// invalCategory is the disk-write category of the invalidation logs.
const invalCategory vfs.DiskWriteCategory = "kvstrata-invalidation"

// deletions tracks the deletes not yet known to be durable.
type deletions struct {
	mu      sync.RWMutex
	next    uint64               // stamp of the next delete
	durable uint64               // deletes stamped below it are durable
	pending map[index.Key]uint64 // key → stamp of its last delete
	swept   int                  // len(pending) after the last sweep
}

// mark records a delete of key that has been applied to the memtable.
func (d *deletions) mark(key index.Key) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending == nil {
		d.pending = make(map[index.Key]uint64)
	}
	s := d.next
	d.next++
	d.pending[key] = s
	return s
}

// size is the number of deletes tracked.
func (d *deletions) size() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.pending)
}

// undurable reports whether a delete of key may not survive a crash.
func (d *deletions) undurable(key index.Key) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	s, ok := d.pending[key]
	return ok && s >= d.durable
}

// stamp returns the stamp below which deletes are applied: a flush or sync
// that starts after the call makes them durable.
func (d *deletions) stamp() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.next
}

// settle records that the deletes stamped below upTo are durable, and
// forgets them once they are many.
func (d *deletions) settle(upTo uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.durable = max(d.durable, upTo)
	if len(d.pending) < 2*d.swept+1024 {
		return
	}
	for k, s := range d.pending {
		if s < d.durable {
			delete(d.pending, k)
		}
	}
	d.swept = len(d.pending)
}

// settleKey records that key's delete stamped s is durable.
func (d *deletions) settleKey(key index.Key, s uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[key] == s {
		delete(d.pending, key)
	}
}

// maxUndurable bounds the deletes whose durability the tier tracks in
// DurabilityWAL mode, which has no periodic flush to settle them: past it,
// a delete syncs the WAL.
const maxUndurable = 1 << 16

// markDeleted records a delete of key that has been applied to the
// memtable. The caller holds key's stripe exclusively.
func (t *Tier) markDeleted(key index.Key) {
	t.dels.mark(key)
	if t.cfg.Durability != DurabilityWAL || t.dels.size() < maxUndurable {
		return
	}
	synced := t.dels.stamp()
	if err := t.commitDelete(key, true); err != nil {
		t.cfg.Logger.Warn("ssd: syncing the WAL", "dir", t.cfg.Dir, "err", err)
		return
	}
	t.dels.settle(synced)
}

// MayResurrect reports whether a block of key deleted earlier might be
// read again after a crash: its deletion is not yet known to be durable.
// It reads nothing but a map in memory.
func (t *Tier) MayResurrect(key index.Key) bool { return t.dels.undurable(key) }

// Invalidate deletes key's block if the tier holds one and returns once
// neither it nor any block of key deleted before the call can be read
// after a crash and reopen. Concurrent calls share their sync. It fails
// with tiers.ErrClosed after Close.
func (t *Tier) Invalidate(key index.Key) error {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return fmt.Errorf("ssd: invalidate %v: %w", key, tiers.ErrClosed)
	}
	wal := t.cfg.Durability == DurabilityWAL
	s := t.stripe(key)
	s.Lock()
	m, gen, err := t.record(key)
	if errors.Is(err, tiers.ErrCorrupt) {
		s.Unlock()
		if err := t.drop(key); err != nil {
			return fmt.Errorf("ssd: invalidate %v: %w", key, err)
		}
		s.Lock()
		m, gen, err = t.record(key)
	}
	held := err == nil
	if err != nil && !errors.Is(err, tiers.ErrNotFound) {
		s.Unlock()
		return fmt.Errorf("ssd: invalidate %v: %w", key, err)
	}
	err = nil
	synced := t.dels.stamp() // with the WAL, deletes before it are synced below
	if held || wal {
		err = t.commitDelete(key, wal)
	}
	if err == nil && held && gen != 0 {
		t.files.doom(key, gen, int64(m.Size))
	}
	s.Unlock()
	if err != nil {
		return fmt.Errorf("ssd: invalidate %v: %w", key, err)
	}
	if held {
		t.acct.release(cost(m.Size), 1)
		t.dirty.Store(true)
	}
	if wal {
		t.dels.settle(synced)
		return nil
	}
	stamp := t.dels.mark(key) // undurable until the log or a flush says otherwise
	if lerr := t.inval.write(key); lerr != nil {
		// The log cannot take it: a flush makes the deletion durable too.
		if ferr := t.flushLocked(); ferr != nil {
			return fmt.Errorf("ssd: invalidate %v: log: %w; flush: %w", key, lerr, ferr)
		}
		return nil
	}
	t.dels.settleKey(key, stamp)
	return nil
}

// commitDelete deletes key's record and payload in one batch, synced to
// the WAL when sync is set, and forgets the record kept in memory. The
// caller holds key's stripe exclusively and fixes the accounting.
func (t *Tier) commitDelete(key index.Key, sync bool) error {
	t.recs.forget(key)
	rk, pk := makeKey(prefixRecord, key), makeKey(prefixPayload, key)
	b := t.db.NewBatch()
	defer b.Close()
	if err := b.Delete(rk[:], nil); err != nil {
		return err
	}
	if err := b.Delete(pk[:], nil); err != nil {
		return err
	}
	opts := pebble.NoSync
	if sync {
		opts = pebble.Sync
	}
	return b.Commit(opts)
}

// flushLocked syncs the block files written since the last flush, then
// flushes the memtable, making every write so far durable; then it
// removes the block files and the invalidation logs that flush covers.
// Every flush of the tier goes through it. The caller holds t.life
// (shared, or exclusively in Close).
func (t *Tier) flushLocked() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	stamp := t.dels.stamp()
	doomed := t.files.stamp()
	t.inval.rotate()
	// A record made durable by the flush names a file already durable.
	if err := t.files.sync(); err != nil {
		return err
	}
	if err := t.flushWait(); err != nil {
		return err
	}
	t.dels.settle(stamp)
	if err := t.files.removeDoomed(doomed); err != nil {
		// Left for the next flush to try again; an Open removes them.
		t.cfg.Logger.Warn("ssd: removing block files", "dir", t.cfg.Dir, "err", err)
	}
	if err := t.inval.removeOld(); err != nil {
		// The logs are replayed at the next Open: harmless but for the
		// keys put again since, which may then read as missing.
		t.cfg.Logger.Warn("ssd: removing invalidation logs", "dir", t.cfg.Dir, "err", err)
	}
	return nil
}

// settleFiles is flushLocked for DurabilityWAL mode, where the memtable
// is not flushed on a schedule: it syncs the block files written since
// the last call and, when removed blocks wait for their files to go, syncs
// the WAL, which makes their deletions durable, and removes the files. It
// runs in the tier's background loop, which Close stops before it closes
// the store.
func (t *Tier) settleFiles() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	doomed := t.files.stamp()
	if err := t.files.sync(); err != nil {
		return err
	}
	if !t.files.pendingRemovals() {
		return nil
	}
	stamp := t.dels.stamp()
	if err := t.db.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("sync the WAL: %w", err)
	}
	t.dels.settle(stamp)
	return t.files.removeDoomed(doomed)
}

// invalLog is the invalidation log of DurabilityFlush mode: records
// appended by concurrent writers are written and synced by one of them
// for all (group commit).
type invalLog struct {
	fs  vfs.FS
	dir string

	mu      sync.Mutex
	cond    *sync.Cond
	f       vfs.File // the current log; nil until its first write
	gen     uint64   // the current log's number
	old     []string // logs rotated out, removed after the next flush
	buf     []byte   // records not yet written
	spare   []byte
	added   uint64 // records appended
	synced  uint64 // records written and synced
	syncing bool   // a writer is writing and syncing for all
	err     error  // the current log failed; the next one starts afresh
}

func newInvalLog(fs vfs.FS, dir string, gen uint64) *invalLog {
	l := &invalLog{fs: fs, dir: dir, gen: gen}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func invalName(gen uint64) string { return fmt.Sprintf("%s%06d", invalidatedPrefix, gen) }

// write appends key to the log and returns once it is synced, with
// whatever other writers appended meanwhile.
func (l *invalLog) write(key index.Key) error {
	var rec [invalRecordSize]byte
	binary.LittleEndian.PutUint64(rec[0:], uint64(key.NS))
	binary.LittleEndian.PutUint64(rec[8:], uint64(key.Hash))
	binary.LittleEndian.PutUint64(rec[16:], xxhash.Sum64(rec[:16]))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, rec[:]...)
	l.added++
	seq := l.added
	for l.synced < seq {
		if l.err != nil {
			return l.err
		}
		if l.syncing {
			l.cond.Wait()
			continue
		}
		l.syncing = true
		buf, upTo, f := l.buf, l.added, l.f
		l.buf = l.spare[:0]
		l.mu.Unlock()
		f, err := l.append(f, buf)
		l.mu.Lock()
		l.f = f
		l.spare = buf
		l.syncing = false
		if err != nil {
			l.err = err
		} else {
			l.synced = upTo
		}
		l.cond.Broadcast()
	}
	return nil
}

// append writes buf to the current log, creating it if f is nil, and
// syncs it. The caller is the one writer (l.syncing). A log is created
// once: a number is not used again after its log was written to (rotate).
func (l *invalLog) append(f vfs.File, buf []byte) (vfs.File, error) {
	if f == nil {
		var err error
		f, err = l.fs.Create(l.fs.PathJoin(l.dir, invalName(l.gen)), invalCategory)
		if err != nil {
			return nil, fmt.Errorf("create invalidation log: %w", err)
		}
		if err := syncDir(l.fs, l.dir); err != nil {
			return f, err
		}
	}
	if _, err := f.Write(buf); err != nil {
		return f, fmt.Errorf("write invalidation log: %w", err)
	}
	if err := f.Sync(); err != nil {
		return f, fmt.Errorf("sync invalidation log: %w", err)
	}
	return f, nil
}

// rotate starts a new log; the current one is removed by removeOld once a
// flush that begins after rotate has succeeded.
func (l *invalLog) rotate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.syncing {
		l.cond.Wait()
	}
	if l.f == nil {
		l.err = nil
		return
	}
	_ = l.f.Close()
	l.old = append(l.old, invalName(l.gen))
	l.f, l.err = nil, nil
	l.gen++
}

// removeOld removes the logs rotated out.
func (l *invalLog) removeOld() error {
	l.mu.Lock()
	old := l.old
	l.old = nil
	l.mu.Unlock()
	if len(old) == 0 {
		return nil
	}
	var errs []error
	for _, name := range old {
		if err := l.fs.Remove(l.fs.PathJoin(l.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, syncDir(l.fs, l.dir))
	return errors.Join(errs...)
}

// close closes the current log, leaving the files.
func (l *invalLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.syncing {
		l.cond.Wait()
	}
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	l.err = tiers.ErrClosed
}

// syncDir syncs a directory, so that files created or removed in it stay
// so after a crash.
func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// replayInvalidations deletes the blocks that the invalidation logs left
// in the store's directory name, makes that durable, removes the logs and
// returns the number the next log takes. It runs in Open, before load.
func (t *Tier) replayInvalidations() (next uint64, err error) {
	fs := t.cfg.FS
	ents, err := fs.List(t.cfg.Dir)
	if err != nil {
		return 0, err
	}
	var names []string
	for _, name := range ents {
		n, ok := strings.CutPrefix(name, invalidatedPrefix)
		if !ok {
			continue
		}
		gen, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			continue
		}
		next = max(next, gen+1)
		names = append(names, name)
	}
	if len(names) == 0 {
		return next, nil
	}
	slices.Sort(names)
	b := t.db.NewBatch()
	defer b.Close()
	var keys int
	for _, name := range names {
		recs, err := readInvalLog(fs, fs.PathJoin(t.cfg.Dir, name))
		if err != nil {
			return 0, err
		}
		for _, key := range recs {
			rk, pk := makeKey(prefixRecord, key), makeKey(prefixPayload, key)
			if err := b.Delete(rk[:], nil); err != nil {
				return 0, err
			}
			if err := b.Delete(pk[:], nil); err != nil {
				return 0, err
			}
			keys++
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, fmt.Errorf("replay invalidations: %w", err)
	}
	if err := t.flushWait(); err != nil {
		return 0, fmt.Errorf("replay invalidations: %w", err)
	}
	for _, name := range names {
		if err := fs.Remove(fs.PathJoin(t.cfg.Dir, name)); err != nil {
			return 0, fmt.Errorf("replay invalidations: %w", err)
		}
	}
	if err := syncDir(fs, t.cfg.Dir); err != nil {
		return 0, fmt.Errorf("replay invalidations: %w", err)
	}
	t.cfg.Logger.Info("ssd: replayed invalidation logs", "dir", t.cfg.Dir, "logs", len(names), "keys", keys)
	return next, nil
}

// readInvalLog returns the keys of a log's intact records, up to the first
// that is not (torn by a crash while it was written, so never
// acknowledged).
func readInvalLog(fs vfs.FS, path string) ([]index.Key, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read invalidation log: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read invalidation log %s: %w", path, err)
	}
	var keys []index.Key
	for ; len(data) >= invalRecordSize; data = data[invalRecordSize:] {
		if binary.LittleEndian.Uint64(data[16:]) != xxhash.Sum64(data[:16]) {
			break
		}
		keys = append(keys, index.Key{
			NS:   index.NamespaceID(binary.LittleEndian.Uint64(data[0:])),
			Hash: index.Hash(binary.LittleEndian.Uint64(data[8:])),
		})
	}
	return keys, nil
}

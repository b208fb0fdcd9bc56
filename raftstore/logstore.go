package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// The store's key space. Log keys sort by index, so that the first and last
// entries are the first and last keys under prefixLog.
const (
	prefixMeta   = 0x00 // store metadata: the format marker
	prefixLog    = 0x01 // prefixLog ‖ be64(index) → encoded raft.Log
	prefixStable = 0x02 // prefixStable ‖ key → value
)

var (
	formatKey     = []byte{prefixMeta, 'f', 'o', 'r', 'm', 'a', 't'}
	formatVersion = []byte("kvstrata-raftlog-1")
)

// Options configures a LogStore. A nil *Options means the defaults.
type Options struct {
	// NoSync commits writes without waiting for Pebble's write-ahead log
	// to reach the disk. That is unsafe under raft: a node that crashes can
	// forget entries it acknowledged, or the vote it cast, and a cluster
	// can then lose committed entries. It exists to measure what syncing
	// costs, and for tests. The default is false: every write is synced.
	NoSync bool
	// CacheSize is Pebble's block cache, in bytes. Raft reads recent
	// entries from its LogCache and older ones only to catch a follower
	// up, so a small cache does. The default is 8 MiB.
	CacheSize int64
	// MemTableSize is the size, in bytes, of Pebble's memtable. Entries
	// that are appended and compacted away before their memtable is
	// flushed never reach an sstable. The default is 32 MiB.
	MemTableSize uint64
	// Logger receives Pebble's errors; its informational lines go at
	// Debug level. The default is slog.Default().
	Logger *slog.Logger
	// FS is the filesystem Pebble uses. The default is the operating
	// system's; tests may pass vfs.NewMem().
	FS vfs.FS
}

// Defaults of Options.
const (
	DefaultCacheSize    = 8 << 20
	DefaultMemTableSize = 32 << 20
)

// EnsureDefaults sets o's zero fields to their defaults.
func (o *Options) EnsureDefaults() {
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
}

// Validate reports every field of o that is out of range in one error.
// Call it after EnsureDefaults.
func (o *Options) Validate() error {
	var errs []error
	if o.CacheSize <= 0 {
		errs = append(errs, fmt.Errorf("CacheSize %d is not positive", o.CacheSize))
	}
	if o.MemTableSize < 1<<20 {
		errs = append(errs, fmt.Errorf("MemTableSize %d is below 1 MiB", o.MemTableSize))
	}
	if o.MemTableSize >= 4<<30 {
		errs = append(errs, fmt.Errorf("MemTableSize %d is 4 GiB or more", o.MemTableSize))
	}
	return errors.Join(errs...)
}

// LogStore keeps raft's log and its stable values (current term, vote) in
// Pebble. It implements raft.LogStore, raft.StableStore and
// raft.MonotonicLogStore. Every write is one Pebble batch, committed with
// pebble.Sync unless Options.NoSync.
//
// All methods are safe for concurrent use, except Close, which must come
// after every other call has returned (after raft.Shutdown). Writes are
// serialized; FirstIndex and LastIndex read cached values and cost an atomic
// load.
//
// The daemon wraps it in raft.NewLogCache, so that the leader replicates
// recent entries from memory rather than reading them back from Pebble:
//
//	store, err := raftstore.Open(dir, nil)
//	logs, err := raft.NewLogCache(512, store)
//	r, err := raft.NewRaft(conf, fsm, logs, store, snaps, transport)
type LogStore struct {
	db     *pebble.DB
	write  *pebble.WriteOptions
	mu     sync.Mutex // serializes writes, so that first and last follow them
	first  atomic.Uint64
	last   atomic.Uint64
	closed atomic.Bool
}

var (
	_ raft.LogStore          = (*LogStore)(nil)
	_ raft.StableStore       = (*LogStore)(nil)
	_ raft.MonotonicLogStore = (*LogStore)(nil)
)

// Open opens the store in dir, creating it if need be; nil opts means the
// defaults.
func Open(dir string, opts *Options) (*LogStore, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("raftstore: open %s: bad options: %w", dir, err)
	}
	cache := pebble.NewCache(o.CacheSize)
	defer cache.Unref()
	db, err := pebble.Open(dir, &pebble.Options{
		FS: o.FS,
		// The format the ssd tier uses too, so that one Pebble build on a
		// node writes one format.
		FormatMajorVersion: pebble.FormatValueSeparation,
		Cache:              cache,
		MemTableSize:       o.MemTableSize,
		Logger:             pebbleLogger{o.Logger},
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				o.Logger.Error("raftstore: pebble background error", "dir", dir, "err", err)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	s := &LogStore{db: db, write: pebble.Sync}
	if o.NoSync {
		s.write = pebble.NoSync
	}
	if err := s.checkFormat(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	if err := s.loadIndexes(0); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("raftstore: open %s: %w", dir, err)
	}
	return s, nil
}

// Close closes the store. Later calls fail with ErrClosed.
func (s *LogStore) Close() error {
	if s.closed.Swap(true) {
		return ErrClosed
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("raftstore: close: %w", err)
	}
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore: after restoring a user
// snapshot, raft deletes the whole log instead of leaving a gap before the
// entries that follow it, which costs one range deletion here.
func (s *LogStore) IsMonotonic() bool { return true }

// checkFormat checks the format marker, writing it into an empty store.
func (s *LogStore) checkFormat() error {
	v, closer, err := s.db.Get(formatKey)
	if err == nil {
		ok := bytes.Equal(v, formatVersion)
		got := string(v)
		_ = closer.Close()
		if !ok {
			return fmt.Errorf("%w: store format %q, this build reads %q", ErrCorrupt, got, formatVersion)
		}
		return nil
	}
	if !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("read format marker: %w", err)
	}
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("check format: %w", err)
	}
	empty := !it.First()
	if err := it.Close(); err != nil {
		return fmt.Errorf("check format: %w", err)
	}
	if !empty {
		return fmt.Errorf("%w: the Pebble store is not a raft log (no format marker)", ErrCorrupt)
	}
	if err := s.db.Set(formatKey, formatVersion, pebble.Sync); err != nil {
		return fmt.Errorf("write format marker: %w", err)
	}
	return nil
}

// loadIndexes reads the first and last log indexes from Pebble, looking at
// indexes from from on. The caller holds s.mu or owns s.
func (s *LogStore) loadIndexes(from uint64) error {
	lower := logKey(from)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower[:], UpperBound: []byte{prefixLog + 1}})
	if err != nil {
		return fmt.Errorf("find first and last index: %w", err)
	}
	var first, last uint64
	if it.First() {
		first = binary.BigEndian.Uint64(it.Key()[1:])
		it.Last()
		last = binary.BigEndian.Uint64(it.Key()[1:])
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("find first and last index: %w", err)
	}
	s.first.Store(first)
	s.last.Store(last)
	return nil
}

// FirstIndex returns the index of the first entry, 0 when there is none.
func (s *LogStore) FirstIndex() (uint64, error) { return s.first.Load(), nil }

// LastIndex returns the index of the last entry, 0 when there is none.
func (s *LogStore) LastIndex() (uint64, error) { return s.last.Load(), nil }

// GetLog reads entry index into log. It fails with raft.ErrLogNotFound
// when there is no such entry.
func (s *LogStore) GetLog(index uint64, log *raft.Log) error {
	if s.closed.Load() {
		return ErrClosed
	}
	k := logKey(index)
	v, closer, err := s.db.Get(k[:])
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("raftstore: get log %d: %w", index, err)
	}
	defer closer.Close()
	if err := decodeLog(v, log); err != nil {
		return fmt.Errorf("raftstore: get log %d: %w", index, err)
	}
	if log.Index != index {
		return fmt.Errorf("raftstore: get log %d: %w: entry under that key has index %d", index, ErrCorrupt, log.Index)
	}
	return nil
}

// StoreLog stores one entry.
func (s *LogStore) StoreLog(log *raft.Log) error {
	return s.StoreLogs([]*raft.Log{log})
}

// StoreLogs stores entries in one batch: all of them or, on error, none.
func (s *LogStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	if s.closed.Load() {
		return ErrClosed
	}
	size := 0
	for _, l := range logs {
		size += len(logKey(0)) + logSize(l)
	}
	b := s.db.NewBatchWithSize(size + 16*len(logs))
	defer b.Close()
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, l := range logs {
		// Encode straight into the batch: an entry is copied once here,
		// then by Pebble into its WAL and memtable.
		k := logKey(l.Index)
		op := b.SetDeferred(len(k), logSize(l))
		copy(op.Key, k[:])
		if v := appendLog(op.Value[:0:len(op.Value)], l); len(v) != len(op.Value) || &v[0] != &op.Value[0] {
			panic(fmt.Sprintf("raftstore: entry %d encodes to %d bytes, logSize says %d", l.Index, len(v), len(op.Value)))
		}
		if err := op.Finish(); err != nil {
			return fmt.Errorf("raftstore: store log %d: %w", l.Index, err)
		}
		lo, hi = min(lo, l.Index), max(hi, l.Index)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := b.Commit(s.write); err != nil {
		return fmt.Errorf("raftstore: store logs %d-%d: %w", lo, hi, err)
	}
	if first := s.first.Load(); first == 0 || lo < first {
		s.first.Store(lo)
	}
	if hi > s.last.Load() {
		s.last.Store(hi)
	}
	return nil
}

// DeleteRange deletes the entries from min to max, both included, with one
// range deletion.
func (s *LogStore) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	if s.closed.Load() {
		return ErrClosed
	}
	lo := logKey(min)
	hi := []byte{prefixLog + 1}
	if max < math.MaxUint64 {
		k := logKey(max + 1)
		hi = k[:]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.db.DeleteRange(lo[:], hi, s.write); err != nil {
		return fmt.Errorf("raftstore: delete logs %d-%d: %w", min, max, err)
	}
	first, last := s.first.Load(), s.last.Load()
	switch {
	case first == 0 || max < first || min > last:
		// Nothing stored was in the range.
	case min > first && max < last:
		// A hole in the middle: the ends stay.
	case min <= first && max < last:
		// The head: the first entry left is at max+1 or after.
		return s.reload(max + 1)
	default:
		// The tail, or everything: look the ends up again.
		return s.reload(0)
	}
	return nil
}

// reload is loadIndexes for DeleteRange, with its error.
func (s *LogStore) reload(from uint64) error {
	if err := s.loadIndexes(from); err != nil {
		return fmt.Errorf("raftstore: delete logs: %w", err)
	}
	return nil
}

// Set stores val under key.
func (s *LogStore) Set(key, val []byte) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := s.db.Set(stableKey(key), val, s.write); err != nil {
		return fmt.Errorf("raftstore: set %q: %w", key, err)
	}
	return nil
}

// Get returns a copy of the value under key. A missing key fails with
// ErrKeyNotFound, whose text is "not found": raft recognizes a missing key
// by that text, as with raft.InmemStore and raft-boltdb.
func (s *LogStore) Get(key []byte) ([]byte, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	v, closer, err := s.db.Get(stableKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("raftstore: get %q: %w", key, err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// SetUint64 stores val under key, 8 bytes big-endian. Set and SetUint64
// share one key space (raft never uses a key both ways).
func (s *LogStore) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns the value that SetUint64 stored under key, and 0 with
// no error for a missing key, as raft.InmemStore does.
func (s *LogStore) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if errors.Is(err, ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raftstore: get %q: %w: %d bytes, want 8", key, ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// logKey returns the Pebble key of entry index.
func logKey(index uint64) [9]byte {
	var k [9]byte
	k[0] = prefixLog
	binary.BigEndian.PutUint64(k[1:], index)
	return k
}

// stableKey returns the Pebble key of stable key key.
func stableKey(key []byte) []byte {
	return append([]byte{prefixStable}, key...)
}

// pebbleLogger sends Pebble's log lines to a slog.Logger: informational
// ones at Debug level, so that a healthy store is quiet.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("raftstore: pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("raftstore: pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is called on errors Pebble cannot go on from; like Pebble's own
// logger it does not return.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := "raftstore: pebble: " + fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic(msg)
}

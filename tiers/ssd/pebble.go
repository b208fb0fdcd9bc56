package ssd

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Value separation settings that are not worth a Config field.
const (
	// blobReferenceDepth bounds how many blob files one sstable may
	// reference before a compaction rewrites the values it covers into new
	// blob files. Pebble's heuristic serves range scans over MVCC data; the
	// tier only does point reads, and block hashes are uniformly random, so
	// every flush overlaps every other and a small bound would make
	// compactions rewrite the blocks again and again. A high bound keeps
	// blocks where the flush wrote them.
	blobReferenceDepth = 1 << 10
	// blobRewriteMinAge and blobGarbageRatio let Pebble rewrite blob files
	// at least that old once that fraction of all blob bytes belongs to
	// deleted blocks, trading write amplification for disk space: at 0.5,
	// at most about 2× each way. Blocks of one flush tend to be evicted
	// together, so many blob files empty out and are deleted whole without
	// a rewrite.
	blobRewriteMinAge = 10 * time.Minute
	blobGarbageRatio  = 0.5
	// bloomBitsPerKey sizes the bloom filters that let a Put of a new key
	// find out that it has no record without reading sstable blocks.
	bloomBitsPerKey = 10
	// lbaseMaxBytes is the size of Pebble's base level. Pebble sizes its
	// levels, and splits its output files, by the bytes that keys reference
	// in blob files as well as by sstable bytes; with the defaults (64 MiB
	// base, 2 MiB files) a GiB of 1 MiB blocks makes ~200 compactions and
	// ~400 blob files of two blocks each, and flushes slow down to wait
	// for them. See pebbleOptions for the file size.
	lbaseMaxBytes = 1 << 30
	// maxOpenFiles bounds Pebble's cache of open sstables and blob files;
	// each flush writes a blob file, and a Get of a block opens its file.
	maxOpenFiles = 1 << 14
)

// pebbleOptions translates cfg, with defaults applied, into Pebble's, on
// filesystem fs; sp hears of flushes and of failures for want of space,
// wf of flushes that succeed.
func pebbleOptions(cfg *Config, fs vfs.FS, sp *space, wf *writeFaults) *pebble.Options {
	log := pebbleLogger{cfg.Logger}
	o := &pebble.Options{
		FS:                 fs,
		FormatMajorVersion: pebble.FormatValueSeparation,
		CacheSize:          cfg.CacheSize,
		MemTableSize:       uint64(cfg.MemTableSize),
		DisableWAL:         cfg.Durability == DurabilityFlush,
		Logger:             log,
		LBaseMaxBytes:      lbaseMaxBytes,
		MaxOpenFiles:       maxOpenFiles,
		EventListener: &pebble.EventListener{
			BackgroundError: func(err error) {
				// Logged once, when the tier starts refusing puts.
				if sp.failed(err) || wf.failing() != nil {
					cfg.Logger.Debug("ssd: pebble background error", "dir", cfg.Dir, "err", err)
					return
				}
				cfg.Logger.Error("ssd: pebble background error", "dir", cfg.Dir, "err", err)
			},
			FlushBegin: func(pebble.FlushInfo) { sp.flushBegan() },
			FlushEnd: func(info pebble.FlushInfo) {
				sp.flushEnded(info.Err)
				if info.Err == nil {
					wf.recovered()
				}
			},
			// Pebble's default is to exit the process; the tier instead
			// reports the block as corrupt when a read runs into the damage.
			DataCorruption: func(info pebble.DataCorruptionInfo) {
				cfg.Logger.Error("ssd: pebble found corrupt data", "dir", cfg.Dir, "path", info.Path, "err", info.Details)
			},
		},
	}
	// A flush normally writes one sstable and one blob file, whatever the
	// memtable holds (see lbaseMaxBytes); deeper levels double the size.
	o.TargetFileSizes[0] = 2 * cfg.MemTableSize
	minSize := cfg.ValueSeparationMinSize
	o.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{
			Enabled:               true,
			MinimumSize:           minSize,
			MaxBlobReferenceDepth: blobReferenceDepth,
			RewriteMinimumAge:     blobRewriteMinAge,
			TargetGarbageRatio:    blobGarbageRatio,
		}
	}
	// KV-cache tensors hardly compress, and the CPU a compressor would burn
	// on every byte is better spent elsewhere on a cache node.
	o.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(bloomBitsPerKey)
	}
	return o
}

// pebbleLogger sends Pebble's log lines to a slog.Logger: informational
// ones at Debug level, so that a healthy store is quiet.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	if p.l.Enabled(context.Background(), slog.LevelDebug) {
		p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
	}
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is called on errors Pebble cannot go on from; like Pebble's own
// logger it does not return.
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	p.l.Error(msg)
	panic(msg)
}

// WriteStats says how many bytes the tier wrote to disk for the bytes it
// was given, since Open. The physical figures count every byte Pebble
// hands to the filesystem, by file kind.
type WriteStats struct {
	// LogicalBytes is the sum of the sizes of the blocks put.
	LogicalBytes int64
	// WALBytes went to the write-ahead log (0 in DurabilityFlush mode).
	WALBytes int64
	// FlushBytes went to sstables and blob files written by flushes.
	FlushBytes int64
	// CompactionBytes went to sstables and blob files written by
	// compactions and blob-file rewrites.
	CompactionBytes int64
	// BlockFileBytes went to block files (blockfile.go).
	BlockFileBytes int64
	// OtherBytes went to Pebble's manifest and options files, and the
	// tier's invalidation logs.
	OtherBytes int64
	// PebbleWriteAmp is Pebble's own figure, Metrics().Total().WriteAmp().
	// It takes the WAL's size as the bytes in, estimated from the flushed
	// bytes when there is no WAL, and Pebble v2.1.7 counts the blob bytes
	// of a flush twice, so it overstates; WriteAmp is the measured figure.
	PebbleWriteAmp float64
}

// PhysicalBytes is every byte written to disk.
func (s WriteStats) PhysicalBytes() int64 {
	return s.WALBytes + s.FlushBytes + s.CompactionBytes + s.BlockFileBytes + s.OtherBytes
}

// WriteAmp is PhysicalBytes / LogicalBytes, or 0 before any put.
func (s WriteStats) WriteAmp() float64 {
	if s.LogicalBytes == 0 {
		return 0
	}
	return float64(s.PhysicalBytes()) / float64(s.LogicalBytes)
}

// countingFS counts the bytes Pebble writes, by the category Pebble gives
// each file it creates, and tells space of writes that fail for want of
// space (see space.go), faults of those that fail otherwise (fault.go): it
// holds back new flush and compaction outputs while the file system is
// full or just failed a write, and removes an output whose write failed
// for want of space when Pebble closes it (Pebble abandons such a file
// without deleting it).
type countingFS struct {
	vfs.FS
	space                                 *space
	faults                                *writeFaults
	wal, flush, compaction, blocks, other atomic.Int64
}

func (fs *countingFS) counter(c vfs.DiskWriteCategory) *atomic.Int64 {
	switch c {
	case "pebble-wal":
		return &fs.wal
	case "pebble-memtable-flush":
		return &fs.flush
	case "pebble-compaction", "pebble-blob-file-rewrite":
		return &fs.compaction
	case blockCategory:
		return &fs.blocks
	}
	return &fs.other
}

// isOutput reports whether files of category c are flush or compaction
// outputs: sstables and blob files that Pebble records only once written.
func isOutput(c vfs.DiskWriteCategory) bool {
	return c == "pebble-memtable-flush" || c == "pebble-compaction" || c == "pebble-blob-file-rewrite"
}

func (fs *countingFS) wrap(f vfs.File, c vfs.DiskWriteCategory, name string, err error) (vfs.File, error) {
	if err != nil {
		fs.failed(err)
		return nil, err
	}
	return &countingFile{File: f, n: fs.counter(c), fs: fs, name: name}, nil
}

// failed tells space or faults of a write that failed; it reports whether
// it failed for want of space.
func (fs *countingFS) failed(err error) bool {
	if fs.space.failed(err) {
		return true
	}
	fs.faults.failed(err)
	return false
}

func (fs *countingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if !isOutput(c) {
		f, err := fs.FS.Create(name, c)
		return fs.wrap(f, c, "", err)
	}
	fs.faults.pace()
	if err := fs.space.waitForRoom(name); err != nil {
		return nil, err
	}
	f, err := fs.FS.Create(name, c)
	return fs.wrap(f, c, name, err)
}

func (fs *countingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(f, c, "", err)
}

func (fs *countingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(f, c, "", err)
}

// writeStats reads the counters.
func (fs *countingFS) writeStats() WriteStats {
	return WriteStats{
		WALBytes:        fs.wal.Load(),
		FlushBytes:      fs.flush.Load(),
		CompactionBytes: fs.compaction.Load(),
		BlockFileBytes:  fs.blocks.Load(),
		OtherBytes:      fs.other.Load(),
	}
}

type countingFile struct {
	vfs.File
	n       *atomic.Int64
	fs      *countingFS
	name    string       // of an output, removed on Close if it failed for want of space
	noSpace atomic.Bool  // a write failed for want of space
	written atomic.Int64 // bytes written
}

// note tells space or faults of a failed write.
func (f *countingFile) note(err error) error {
	if err != nil && f.fs.failed(err) {
		f.noSpace.Store(true)
	}
	return err
}

func (f *countingFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.n.Add(int64(n))
	f.written.Add(int64(n))
	return n, f.note(err)
}

func (f *countingFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.n.Add(int64(n))
	f.written.Add(int64(n))
	return n, f.note(err)
}

func (f *countingFile) Sync() error     { return f.note(f.File.Sync()) }
func (f *countingFile) SyncData() error { return f.note(f.File.SyncData()) }

func (f *countingFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	return full, f.note(err)
}

// Close closes the file and removes an output that failed for want of
// space: one whose write failed so, or one left empty (which no finished
// output is) while the file system is full, the companion of an output
// that failed.
func (f *countingFile) Close() error {
	err := f.File.Close()
	if f.name != "" && (f.noSpace.Load() || f.written.Load() == 0 && f.fs.space.failing() != nil) {
		if rerr := f.fs.FS.Remove(f.name); rerr != nil {
			f.fs.space.log.Warn("ssd: remove an output that failed for want of space", "file", f.name, "err", rerr)
		}
	}
	return err
}

package ssd

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// Durability says which acknowledged writes a crash may lose.
type Durability uint8

// The durability modes. The zero value stands for the default, DurabilityFlush.
const (
	// DurabilityFlush runs Pebble without its write-ahead log: a Put lands
	// in the memtable, and the tier flushes a memtable that holds anything
	// new every Config.FlushInterval, on Flush and on Close. Each byte is
	// written to disk about once, which is what makes this mode fast. A
	// crash of the process or of the machine loses the puts and deletes
	// acknowledged since the last completed flush (about FlushInterval of
	// writes, plus any memtable still being flushed): lost puts read as
	// missing, lost deletes bring the old block back intact. Flushed data
	// survives power loss (Pebble syncs flushed files and its manifest).
	DurabilityFlush Durability = iota + 1
	// DurabilityWAL also writes every Put and Delete to Pebble's write-ahead
	// log, without fsync. Pebble hands the log to the kernel from a
	// background goroutine in 32 KiB blocks, so a crash of the process
	// loses the writes acknowledged in the last moments, those still in
	// Pebble's log buffer (a few per crash in the crash test); a crash of
	// the machine also loses what the kernel had not yet written back. Lost
	// writes read as in DurabilityFlush, and Flush still makes everything
	// acknowledged durable. (Block files are synced every FlushInterval; a
	// record that outlives a machine crash while its file's bytes did not
	// reads as a corrupt block, which is dropped.) Every byte of an inline
	// block is written twice (log, then flushed file): write amplification
	// is at least 2 and puts are slower. A block in a block file is written
	// once; the log carries only its record.
	DurabilityWAL
)

func (d Durability) String() string {
	switch d {
	case DurabilityFlush:
		return "flush"
	case DurabilityWAL:
		return "wal"
	}
	return fmt.Sprintf("durability(%d)", uint8(d))
}

// Defaults and limits of Config.
const (
	DefaultMaxBlockSize           = 4 << 20
	DefaultFlushInterval          = time.Second
	DefaultMemTableSize           = 64 << 20
	DefaultCacheSize              = 64 << 20
	DefaultValueSeparationMinSize = 1 << 10
	DefaultReadWindow             = 4
	DefaultReadAhead              = 32 << 20
	DefaultFileMinSize            = 64 << 10
	DefaultOpenFiles              = 4096
	DefaultRecordCache            = 1 << 16
	// MaxRecordCache bounds RecordCache: 1 GiB of slots, the records of
	// 64 TiB of 1 MiB blocks.
	MaxRecordCache = (1 << 30) / recordSlotSize

	// MaxBlockLimit is the largest MaxBlockSize allowed.
	MaxBlockLimit = 1 << 30
	// MaxMemTableSize is the largest MemTableSize allowed.
	MaxMemTableSize = 2 << 30
)

// Config configures a Tier. The zero value of every field but Dir and
// Capacity means its default; Open applies them with EnsureDefaults.
type Config struct {
	// Dir is the directory of the tier's Pebble store; Open creates it if
	// missing. Required.
	Dir string
	// Capacity is the most bytes the tier holds, counting each block as its
	// size plus RecordOverhead (Stats.Used). It bounds the logical size:
	// on disk the store takes more, up to about twice as much under steady
	// eviction, while deleted blocks wait for their space to be reclaimed
	// (Tier.DiskUsage). Required, > 0.
	Capacity int64
	// MaxBlockSize is the largest block Put accepts, in bytes; at most
	// Capacity and MaxBlockLimit. The default is 4 MiB, or Capacity when
	// that is smaller.
	MaxBlockSize int64
	// Durability says which acknowledged writes a crash may lose; see the
	// constants. The default is DurabilityFlush, chosen by measurement
	// (bench/ssd-fio.sh) when every block was inline: it writes each byte
	// to disk once (write amplification 1.00 against 2.00 with the WAL),
	// and puts went about as fast as a plain file write where
	// DurabilityWAL reached about half. For blocks in block files both
	// modes write each byte once.
	Durability Durability
	// FlushInterval is, in DurabilityFlush mode, how often a background
	// goroutine flushes the memtable when anything was written since the
	// last flush; it bounds how much time of acknowledged writes a crash
	// loses. Each flush writes a blob file, so under a light write load a
	// short interval makes many small files. Ignored in DurabilityWAL
	// mode. The default is 1s.
	FlushInterval time.Duration
	// MemTableSize is the size in bytes of one Pebble memtable; a full one
	// is flushed at once into one sstable and one blob file, and Pebble
	// keeps up to two in memory. Blocks over half of it bypass the memtable
	// as a batch of their own, which forces a flush: keep it well over
	// 2×MaxBlockSize. At most MaxMemTableSize. The default is 64 MiB.
	MemTableSize int64
	// CacheSize is the size in bytes of Pebble's block cache, which holds
	// metadata records and recently read blocks. The default is 64 MiB.
	CacheSize int64
	// ValueSeparationMinSize is the smallest block, in bytes, that Pebble
	// stores in a blob file rather than inside its sstables; blocks in blob
	// files are written once and not rewritten by compactions. The default
	// is 1 KiB.
	ValueSeparationMinSize int
	// FileMinSize is the smallest block, in bytes, that the tier writes to
	// a block file of its own (blockfile.go) rather than into Pebble: such
	// a block is read with one read of the file straight into the caller's
	// buffer, and a reader with its own path to the disk finds it
	// (LocateFile). Smaller blocks stay inline, where a file each would
	// cost more in metadata than it saves. The default is 64 KiB: from
	// there up a block file read from the disk at least as fast as an
	// inline value (BenchmarkGetColdBySize).
	FileMinSize int64
	// ReadWindow is how many block reads GetMany keeps in flight: Pebble
	// reads an inline block with one synchronous read and no kernel
	// readahead, so a chain read one block after another leaves the disk
	// idle between reads; a window of parallel reads keeps it busy (block
	// files are also read ahead: ReadAhead). Each read in flight holds one
	// block in memory. The default is 4: a node reads a context ahead in up
	// to FetchConcurrency/4 chunks at once (api/node), so with its default
	// of 16 the SSD sees 16 reads in flight.
	ReadWindow int
	// ReadAhead is how many bytes of block files GetMany asks the kernel
	// for (posix_fadvise WILLNEED) ahead of the reads it has done, in the
	// order of its keys, so that the disk works on a deep queue of
	// requests, as it does for a sequential read of one file. At most
	// 128 files are open ahead, whatever their size. The bytes go to
	// the page cache, not the Go heap: the bound is on page cache a chain
	// fills before it is read. The default is 32 MiB.
	ReadAhead int64
	// OpenFiles is how many block files of blocks under 512 KiB the tier
	// keeps open between reads, the most recently read ones, when FS is
	// the operating system's: a read of a file kept open costs no open or
	// close. A file is closed when its block is deleted or replaced, and
	// on Close. Each takes a file descriptor; the tier takes at most a
	// quarter of the process's limit (RLIMIT_NOFILE, which Go raises to
	// its hard limit at start). The default is 4096 (256 MiB of 64 KiB
	// blocks); -1 keeps none open.
	OpenFiles int
	// RecordCache is how many blocks' metadata records the tier keeps in
	// memory, those read or written lately, so that a read of the block
	// does not look its record up in Pebble again (recordcache.go). Each
	// takes 48 bytes, allocated at Open whatever the number of blocks
	// stored: the default, 65536, takes 3 MiB and holds the records of
	// 4 GiB of 64 KiB blocks. A key shares its slot with others, so a
	// table that holds about as many records as are read may miss on some
	// of them. -1 keeps none.
	RecordCache int
	// DiskReserve is the free space, in bytes, the tier leaves on its file
	// system for Pebble's own upkeep (flushes of what is already accepted,
	// compactions, its manifest) and for whatever else shares the file
	// system: a Put that would leave less free, counting the bytes not yet
	// flushed, is refused with an error wrapping tiers.ErrNoSpace, and the
	// tier reports itself degraded (Degraded) until space returns. The
	// default, 0, is 1/32 of the file system's size, at least 8 MiB and at
	// most 1 GiB; -1 leaves nothing free.
	DiskReserve int64
	// FS is the file system the store lives on: Pebble's files, the
	// block files and the tier's invalidation logs. The default is the operating system's
	// (vfs.Default); tests inject faults with it.
	FS vfs.FS
	// Logger receives Pebble's log lines (informational ones at Debug
	// level) and the tier's background errors. The default is
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults replaces the zero value of every optional field with its
// default. It leaves invalid values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = DefaultMaxBlockSize
		if c.Capacity > 0 && c.Capacity < c.MaxBlockSize {
			c.MaxBlockSize = c.Capacity
		}
	}
	if c.Durability == 0 {
		c.Durability = DurabilityFlush
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MemTableSize == 0 {
		c.MemTableSize = DefaultMemTableSize
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.ValueSeparationMinSize == 0 {
		c.ValueSeparationMinSize = DefaultValueSeparationMinSize
	}
	if c.ReadWindow == 0 {
		c.ReadWindow = DefaultReadWindow
	}
	if c.ReadAhead == 0 {
		c.ReadAhead = DefaultReadAhead
	}
	if c.FileMinSize == 0 {
		c.FileMinSize = DefaultFileMinSize
	}
	if c.OpenFiles == 0 {
		c.OpenFiles = DefaultOpenFiles
	}
	if c.RecordCache == 0 {
		c.RecordCache = DefaultRecordCache
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.FS == nil {
		c.FS = vfs.Default
	}
}

// Validate reports every problem of c in one error that wraps
// tiers.ErrInvalidConfig. Call it after EnsureDefaults: zero values of
// optional fields are reported as invalid.
func (c *Config) Validate() error {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if c.Dir == "" {
		bad("Dir is empty")
	}
	if c.Capacity <= 0 {
		bad("Capacity is %d, want > 0", c.Capacity)
	}
	switch {
	case c.MaxBlockSize <= 0:
		bad("MaxBlockSize is %d, want > 0", c.MaxBlockSize)
	case c.MaxBlockSize > MaxBlockLimit:
		bad("MaxBlockSize is %s, over the %s limit",
			units.FormatBytes(c.MaxBlockSize), units.FormatBytes(MaxBlockLimit))
	case c.Capacity > 0 && c.MaxBlockSize > c.Capacity:
		bad("MaxBlockSize (%s) is over Capacity (%s)",
			units.FormatBytes(c.MaxBlockSize), units.FormatBytes(c.Capacity))
	}
	if c.Durability != DurabilityFlush && c.Durability != DurabilityWAL {
		bad("Durability is %v, want DurabilityFlush or DurabilityWAL", c.Durability)
	}
	if c.FlushInterval <= 0 {
		bad("FlushInterval is %v, want > 0", c.FlushInterval)
	}
	if c.MemTableSize <= 0 || c.MemTableSize > MaxMemTableSize {
		bad("MemTableSize is %d, want 1 to %d bytes", c.MemTableSize, int64(MaxMemTableSize))
	}
	if c.CacheSize <= 0 {
		bad("CacheSize is %d, want > 0", c.CacheSize)
	}
	if c.ValueSeparationMinSize <= 0 {
		bad("ValueSeparationMinSize is %d, want > 0", c.ValueSeparationMinSize)
	}
	if c.ReadWindow <= 0 {
		bad("ReadWindow is %d, want > 0", c.ReadWindow)
	}
	if c.ReadAhead <= 0 {
		bad("ReadAhead is %d, want > 0", c.ReadAhead)
	}
	if c.FileMinSize <= 0 {
		bad("FileMinSize is %d, want > 0", c.FileMinSize)
	}
	if c.OpenFiles < -1 {
		bad("OpenFiles is %d, want ≥ 0, or -1 for none", c.OpenFiles)
	}
	if c.RecordCache < -1 || c.RecordCache > MaxRecordCache {
		bad("RecordCache is %d, want 0 to %d, or -1 for none", c.RecordCache, MaxRecordCache)
	}
	if c.DiskReserve < -1 {
		bad("DiskReserve is %d, want ≥ 0, or -1 for none", c.DiskReserve)
	}
	if c.Logger == nil {
		bad("Logger is nil")
	}
	if c.FS == nil {
		bad("FS is nil")
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("ssd: %w: %s", tiers.ErrInvalidConfig, strings.Join(problems, "; "))
}

package ssd

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// This file keeps the tier within its file system's free space. The
// configured Capacity bounds the bytes of blocks; nothing but the file
// system bounds the bytes Pebble writes, and a Pebble whose flush fails for
// want of space retries it for ever while writes pile up in its memtables
// until every commit waits. So the tier
//
//   - refuses a Put, with an error wrapping tiers.ErrNoSpace, when the
//     file system's free space less the bytes not yet flushed would drop
//     under Config.DiskReserve: the reserve is there for what was already
//     accepted, Pebble's compactions and manifest, and other users;
//   - watches Pebble's writes: one that fails with ENOSPC (someone else
//     filled the disk) makes the tier refuse puts at once, until a flush
//     succeeds or the space is back; meanwhile new flush and compaction
//     outputs wait for space (at most a second per try) instead of being
//     created to fail, and an output whose write failed is removed when
//     Pebble closes it, so no empty files are left behind;
//   - reports itself degraded (Degraded) while it cannot take a block of
//     the largest size, and its Capacity as what the file system lets it
//     hold, so that the hierarchy demotes past it and keeps it under its
//     watermarks;
//   - waits for a flush only until it is known to fail for space (Flush,
//     Close).

// Bounds of the default disk reserve.
const (
	minDiskReserve = 8 << 20
	maxDiskReserve = 1 << 30
)

// spaceRetry is how long a flush or compaction output waits for space
// after a failure before it is refused again; Pebble retries a failed
// flush at once, so it is also the pace of those retries.
const spaceRetry = time.Second

// space tracks the room left on the tier's file system. It is safe for
// concurrent use.
type space struct {
	fs       vfs.FS
	dir      string
	reserve  int64 // bytes left free
	maxBlock int64
	log      *slog.Logger
	known    bool // the file system reports its free space

	// unflushed is the bytes put that Pebble has not yet written to disk,
	// as far as the tier can tell: Puts add their cost, a completed flush
	// takes off what was there when it began (flushBase).
	unflushed atomic.Int64
	flushBase atomic.Int64

	// Samples the background loop takes, for Capacity.
	usage, avail atomic.Int64

	mu      sync.Mutex
	failure error     // the last write that failed with ENOSPC, until space returns
	full    bool      // no room for a block of the largest size (logged on each change)
	since   time.Time // of full
	why     error     // of full, wrapping tiers.ErrNoSpace
}

// newSpace resolves the reserve of cfg on its file system.
func newSpace(cfg *Config) *space {
	s := &space{fs: cfg.FS, dir: cfg.Dir, maxBlock: cfg.MaxBlockSize, log: cfg.Logger}
	du, err := cfg.FS.GetDiskUsage(cfg.Dir)
	s.known = err == nil
	switch {
	case cfg.DiskReserve > 0:
		s.reserve = cfg.DiskReserve
	case cfg.DiskReserve == 0 && s.known:
		s.reserve = min(max(int64(du.TotalBytes)/32, minDiskReserve), maxDiskReserve)
	}
	if s.known {
		s.avail.Store(int64(du.AvailBytes))
	}
	return s
}

// free returns the file system's free bytes now.
func (s *space) free() (int64, bool) {
	if !s.known {
		return 0, false
	}
	du, err := s.fs.GetDiskUsage(s.dir)
	if err != nil {
		return 0, false
	}
	return int64(du.AvailBytes), true
}

// room returns the bytes the tier may still put, and the free space it
// saw.
func (s *space) room() (room, avail int64, ok bool) {
	avail, ok = s.free()
	if !ok {
		return 1<<63 - 1, 0, false
	}
	return avail - s.reserve - s.unflushed.Load(), avail, true
}

// check says whether a Put of need more bytes may go ahead: nil, or an
// error wrapping tiers.ErrNoSpace. The tier counts as full while it has
// no room for a block of the largest size, and as full again only once it
// has room for two, so that it does not flap at the edge.
func (s *space) check(need int64) error {
	room, avail, ok := s.room()
	s.mu.Lock()
	defer s.mu.Unlock()
	enough := s.maxBlock
	if s.full {
		enough = 2 * s.maxBlock
	}
	if s.failure != nil && ok && room >= enough {
		s.failure = nil // space came back
	}
	var err error
	switch {
	case s.failure != nil:
		err = fmt.Errorf("%w: ssd: file system of %s full: %v", tiers.ErrNoSpace, s.dir, s.failure)
	case ok && room < need:
		err = fmt.Errorf("%w: ssd: file system of %s full: %s free, %s kept in reserve, %s not yet flushed; the block needs %s",
			tiers.ErrNoSpace, s.dir, units.FormatBytes(avail), units.FormatBytes(s.reserve),
			units.FormatBytes(s.unflushed.Load()), units.FormatBytes(need))
	}
	s.setFullLocked(s.failure != nil || ok && room < enough, err)
	return err
}

// degraded returns why the tier counts as full now (see check), or nil.
func (s *space) degraded() error {
	_ = s.check(s.maxBlock)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return nil
	}
	return fmt.Errorf("full since %s: %w", s.since.Format(time.RFC3339), s.why)
}

// setFullLocked records whether the tier refuses puts, logging changes.
func (s *space) setFullLocked(full bool, why error) {
	if full == s.full {
		return
	}
	s.full, s.since = full, time.Now()
	if full {
		if why == nil {
			why = fmt.Errorf("%w: ssd: file system of %s has no room for a block of %s beside its %s reserve",
				tiers.ErrNoSpace, s.dir, units.FormatBytes(s.maxBlock), units.FormatBytes(s.reserve))
		}
		s.why = why
		s.log.Warn("ssd: file system full: refusing puts until space returns", "dir", s.dir, "reason", why)
	} else {
		s.log.Info("ssd: file system has room again: taking puts", "dir", s.dir)
	}
}

// failed records a write of Pebble's that failed; it reports whether the
// failure was for want of space.
func (s *space) failed(err error) bool {
	if !isNoSpace(err) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failure == nil {
		s.failure = err
		s.setFullLocked(true, err)
	}
	return true
}

// failing returns the last write failure for space, if space has not come
// back since (as last checked).
func (s *space) failing() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// flushBegan and flushEnded keep unflushed and clear a failure once a
// flush succeeds.
func (s *space) flushBegan() { s.flushBase.Store(s.unflushed.Load()) }

func (s *space) flushEnded(err error) {
	if err != nil {
		// Failed, and Pebble tries again; or wrote nothing ("empty
		// table"), which the next flush settles.
		s.failed(err)
		return
	}
	s.unflushed.Add(-s.flushBase.Swap(0))
	s.mu.Lock()
	s.failure = nil
	s.mu.Unlock()
}

// waitForRoom holds back the creation of a flush or compaction output
// while the last write failed for space: until a check finds room for a
// block, at most spaceRetry. It returns an error wrapping ENOSPC if space
// did not come back, so that Pebble's retry fails without creating a file.
func (s *space) waitForRoom(name string) error {
	deadline := time.Now().Add(spaceRetry)
	for {
		_ = s.check(0) // clears the failure once there is room
		err := s.failing()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return &vfsNoSpaceError{name: name, cause: err}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sample records the store's disk usage and the free space, for
// capacity.
func (s *space) sample(usage int64) {
	s.usage.Store(usage)
	if avail, ok := s.free(); ok {
		s.avail.Store(avail)
	}
	_ = s.check(s.maxBlock)
}

// capacity returns the bytes the tier may hold: configured, or less when
// the file system has no room for that much beside its reserve.
func (s *space) capacity(configured int64) int64 {
	if !s.known {
		return configured
	}
	return max(0, min(configured, s.usage.Load()+s.avail.Load()-s.reserve))
}

// isNoSpace reports whether err is a file system's "no space left".
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// vfsNoSpaceError is the error of an output file the tier refuses to
// create while the file system is full.
type vfsNoSpaceError struct {
	name  string
	cause error
}

func (e *vfsNoSpaceError) Error() string {
	return fmt.Sprintf("ssd: create %s: file system still full after %v: %v", e.name, spaceRetry, e.cause)
}

func (e *vfsNoSpaceError) Unwrap() error { return syscall.ENOSPC }

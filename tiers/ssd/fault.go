package ssd

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/tiers"
)

// This file handles writes of Pebble's that fail for another reason than
// space (space.go handles those): an I/O error of a failing disk. Pebble
// retries a failed flush at once and for ever, and keeps taking writes
// into its memtables until they fill, after which every commit waits. So
// after such a failure the tier
//
//   - refuses puts, with an error wrapping ErrWriteFailing, and reports
//     itself degraded (Degraded), until a flush succeeds or faultHold
//     passes without another failure;
//   - paces the creation of flush and compaction outputs to one every
//     spaceRetry, so that Pebble's retries do not spin (nor log in a loop);
//   - stops Flush and Close from waiting for a flush that fails.
//
// Reads are not affected: a read that fails returns its error, and the
// block stays. What Pebble itself cannot go on from is fatal by Pebble's
// design: a failed write or sync of its write-ahead log (DurabilityWAL) or
// of its MANIFEST makes Pebble call Logger.Fatalf, whose contract is not
// to return; the tier's logger panics with Pebble's message (pebble.go).

// ErrWriteFailing marks a Put refused because the tier's disk failed a
// write lately for another reason than space (an I/O error); it wraps
// tiers.ErrDeviceFailing, so a hierarchy passes the block to a lower level.
// The tier takes puts again by itself once a flush succeeds.
var ErrWriteFailing = fmt.Errorf("ssd: disk writes failing: %w", tiers.ErrDeviceFailing)

// faultHold is how long a failed write keeps the tier refusing puts when
// no flush succeeds meanwhile. Pebble retries a failing flush every
// spaceRetry (paced by writeFaults.pace), so while one keeps failing the
// hold does not lapse.
const faultHold = 3 * spaceRetry

// writeFaults tracks the writes of Pebble's that failed with an I/O error.
// It is safe for concurrent use.
type writeFaults struct {
	dir string
	log *slog.Logger

	mu    sync.Mutex
	err   error     // the last failure of the current run; nil when none
	since time.Time // when the current run began
	last  time.Time // when its last failure was
}

// failed records a write that failed with err, not for want of space.
func (w *writeFaults) failed(err error) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil || now.Sub(w.last) > faultHold {
		w.since = now
		w.log.Error("ssd: disk write failed: refusing puts until a flush succeeds", "dir", w.dir, "err", err)
	}
	w.err, w.last = err, now
}

// failing returns an error wrapping ErrWriteFailing while writes fail, or
// nil.
func (w *writeFaults) failing() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil || time.Since(w.last) > faultHold {
		return nil
	}
	return fmt.Errorf("%w since %s: %v", ErrWriteFailing, w.since.Format(time.RFC3339), w.err)
}

// failedSince returns an error wrapping ErrWriteFailing if a write failed
// at t or later, or nil.
func (w *writeFaults) failedSince(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil || w.last.Before(t) {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrWriteFailing, w.err)
}

// recovered ends a run of failures: a flush succeeded.
func (w *writeFaults) recovered() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		w.log.Info("ssd: disk writes succeed again: taking puts", "dir", w.dir)
		w.err = nil
	}
}

// pace holds back the creation of a flush or compaction output until
// spaceRetry has passed since the last failed write.
func (w *writeFaults) pace() {
	w.mu.Lock()
	wait := time.Duration(0)
	if w.err != nil {
		wait = spaceRetry - time.Since(w.last)
	}
	w.mu.Unlock()
	if wait > 0 {
		time.Sleep(wait)
	}
}

package s3

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/tiers"
)

// UnavailableError is the error of a tier that cannot reach its store; it
// matches tiers.ErrUnavailable and unwraps to the last failure.
type UnavailableError struct {
	Since time.Time // when the tier was marked unavailable
	Err   error     // the failure that marked it, or the last failed probe
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("s3: store unavailable since %s: %v", e.Since.Format(time.RFC3339Nano), e.Err)
}

func (e *UnavailableError) Is(target error) bool { return target == tiers.ErrUnavailable }
func (e *UnavailableError) Unwrap() error        { return e.Err }

// availability is the tier's view of its store, a two-state machine:
//
//	available ──(threshold failed attempts in a row)──▶ unavailable
//	unavailable ──(a probe of the bucket succeeds)──▶ available
//
// An attempt that the store answers, even with "no such key", resets the
// count of failures. While unavailable, requests fail at once and only
// the probe talks to the store. It is safe for concurrent use.
type availability struct {
	threshold int
	log       *slog.Logger

	mu    sync.Mutex
	down  bool
	since time.Time // of the current state
	cause error     // while down
	fails int       // failed attempts in a row while up
	up    chan struct{}
}

func newAvailability(threshold int, log *slog.Logger) *availability {
	return &availability{threshold: threshold, log: log, since: time.Now(), up: make(chan struct{})}
}

// err returns nil while the store is available, else an
// *UnavailableError.
func (a *availability) err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		return nil
	}
	return &UnavailableError{Since: a.since, Err: a.cause}
}

// state returns whether the store is available and since when.
func (a *availability) state() (ok bool, since time.Time, cause error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.down, a.since, a.cause
}

// success records an attempt the store answered.
func (a *availability) success() {
	a.mu.Lock()
	a.fails = 0
	a.mu.Unlock()
}

// failure records a failed attempt; the threshold-th in a row marks the
// store unavailable.
func (a *availability) failure(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		a.cause = err
		return
	}
	a.fails++
	if a.fails < a.threshold {
		return
	}
	a.down, a.since, a.cause = true, time.Now(), err
	a.up = make(chan struct{})
	a.log.Warn("s3: store unavailable", "failures", a.fails, "err", err)
}

// markDown marks the store unavailable at once (a store Open could not
// reach).
func (a *availability) markDown(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		a.down, a.since, a.up = true, time.Now(), make(chan struct{})
	}
	a.cause = err
}

// recovered marks the store available after a successful probe.
func (a *availability) recovered() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		return
	}
	a.log.Info("s3: store available again", "down", time.Since(a.since).Round(time.Millisecond))
	a.down, a.since, a.cause, a.fails = false, time.Now(), nil, 0
	close(a.up)
}

// upCh returns a channel that is closed when the store is available:
// already closed while it is.
func (a *availability) upCh() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		return closedCh
	}
	return a.up
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// probeLoop asks the store whether the bucket is there every interval
// while it is marked unavailable, and marks it available again when it
// answers yes; then wake is called so that pending work resumes.
func (t *Tier) probeLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(t.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		if t.avail.err() == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.RequestTimeout)
		unlisted := t.unlisted.Load()
		err := t.store.probe(ctx, unlisted && t.cfg.CreateBucket)
		cancel()
		if err == nil && unlisted { // opened offline: learn what the bucket holds first
			if err = t.connect(context.WithValue(t.ctx, evenIfDownKey{}, true)); err == nil {
				t.cfg.Logger.Info("s3: store reached; bucket listed", "blocks", t.Stats().Blocks)
			}
		}
		if err != nil {
			t.avail.failure(err)
			continue
		}
		t.avail.recovered()
		t.retryUploadsNow()
		t.wakeDeleter()
	}
}

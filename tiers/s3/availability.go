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
//	available ──(a request failed or is slow, and a probe too)──▶ unavailable
//	unavailable ──(a probe of the bucket succeeds)──▶ available
//
// An attempt that the store answers, even with "no such key", resets the
// count of failures. A request that fails, or goes ProbeTimeout without an
// answer, makes the store suspect: a check (one at a time) probes the
// bucket within ProbeTimeout, and marks the store unavailable at once when
// that gets no answer either and no other request was answered meanwhile
// (a busy store may answer a probe late). Marking it unavailable cuts
// every request in flight (see cut). While unavailable, requests fail at
// once and only the probe talks to the store. It is safe for concurrent
// use.
type availability struct {
	threshold int
	log       *slog.Logger

	// probe asks the store whether the bucket is there, within the
	// deadline of ctx; timeout is that deadline. Set by watch.
	probe   func(ctx context.Context) error
	timeout time.Duration
	ctx     context.Context // ends when the tier closes
	checks  sync.WaitGroup

	mu       sync.Mutex
	down     bool
	since    time.Time // of the current state
	cause    error     // while down
	fails    int       // failed attempts in a row while up
	up       chan struct{}
	cutCtx   context.Context // cancelled when the store is marked unavailable
	cutAll   context.CancelFunc
	checking bool      // a check is running
	stopped  bool      // the tier closed: no more checks
	heardAt  time.Time // when the store last answered
}

func newAvailability(threshold int, log *slog.Logger) *availability {
	a := &availability{threshold: threshold, log: log, since: time.Now(), up: make(chan struct{})}
	a.cutCtx, a.cutAll = context.WithCancel(context.Background())
	return a
}

// watch lets suspect start checks: probe within timeout, until ctx ends.
func (a *availability) watch(ctx context.Context, timeout time.Duration, probe func(context.Context) error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ctx, a.timeout, a.probe = ctx, timeout, probe
}

// stop ends the checks and waits for the one running, if any.
func (a *availability) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	a.checks.Wait()
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

// cut returns a context that is cancelled when the store is marked
// unavailable (already cancelled while it is): the requests in flight
// derive their deadlines from it, so that none waits for a store that is
// known to be down.
func (a *availability) cut() context.Context {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cutCtx
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
	a.heardAt = time.Now()
	a.mu.Unlock()
}

// heard records that the store began to answer a request.
func (a *availability) heard() {
	a.mu.Lock()
	a.heardAt = time.Now()
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
	a.setDownLocked(err)
	a.log.Warn("s3: store unavailable", "failures", a.fails, "err", err)
}

// suspect starts a check of the store, why being what made it suspect
// (a failed or slow request), unless the store is marked unavailable
// already or a check is running. The check probes the bucket within the
// probe timeout and marks the store unavailable if the probe fails too.
func (a *availability) suspect(why error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down || a.checking || a.stopped || a.probe == nil {
		return
	}
	a.checking = true
	a.checks.Add(1)
	go a.check(why)
}

func (a *availability) check(why error) {
	defer a.checks.Done()
	start := time.Now()
	ctx, cancel := context.WithTimeout(a.ctx, a.timeout)
	err := a.probe(ctx)
	cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.checking = false
	if err == nil || a.down || a.ctx.Err() != nil || a.heardAt.After(start) {
		return // the store answers
	}
	err = fmt.Errorf("%w; and %w", why, err)
	a.setDownLocked(err)
	a.log.Warn("s3: store unavailable: a probe got no answer either",
		"probe", time.Since(start).Round(time.Millisecond), "err", err)
}

// setDownLocked marks the store unavailable and cuts the requests in
// flight.
func (a *availability) setDownLocked(err error) {
	a.down, a.since, a.cause = true, time.Now(), err
	a.up = make(chan struct{})
	a.cutAll()
}

// markDown marks the store unavailable at once (a store Open could not
// reach).
func (a *availability) markDown(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.down {
		a.setDownLocked(err)
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
	a.cutCtx, a.cutAll = context.WithCancel(context.Background())
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
		ctx, cancel := context.WithTimeout(t.ctx, t.cfg.ProbeTimeout)
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

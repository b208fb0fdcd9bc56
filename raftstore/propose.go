package raftstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// This file holds the Batcher's sending: the run goroutine that seals
// batches when they are due, proposes them in order, and handles results.

// run is the batcher's goroutine.
func (b *Batcher) run() {
	defer b.wg.Done()
	sealTimer := time.NewTimer(time.Hour)
	sealTimer.Stop()
	var backoff <-chan time.Time
	for {
		var sealDue <-chan time.Time
		b.mu.Lock()
		now := time.Now()
		if b.cur.Len() > 0 {
			due := b.curSince.Add(b.cfg.MaxDelay)
			if next := b.sealed.Add(b.cfg.MinInterval); next.After(due) {
				due = next
			}
			if wait := due.Sub(now); wait > 0 {
				sealTimer.Reset(wait)
				sealDue = sealTimer.C
			} else if b.canSendLocked() {
				b.sealLocked()
			} // else it grows until a proposal returns or is submitted
		}
		if b.recovering && b.inflight == 0 && backoff == nil {
			backoff = time.After(b.backoffLocked())
		}
		b.sendLocked()
		b.mu.Unlock()

		select {
		case <-b.wake:
		case <-sealDue:
		case r := <-b.results:
			b.handle(r)
		case <-backoff:
			backoff = nil
			b.resume()
		case <-b.retry:
			b.mu.Lock()
			b.backoffStep = 0
			b.mu.Unlock()
			if backoff != nil {
				backoff = nil
				b.resume()
			}
		case <-b.quit:
			sealTimer.Stop()
			return
		}
	}
}

// canSendLocked reports whether a batch sealed now would be proposed at
// once: nothing sealed waits, a proposal may start, and the last one is
// submitted. A partial batch that is due (MaxDelay, MinInterval) is
// sealed only then, so that a slow or serial ProposeFunc (a follower
// forwarding to the leader) gets fewer, fuller batches instead of a
// backlog of small ones that each cost a round trip. The caller holds
// b.mu.
func (b *Batcher) canSendLocked() bool {
	if b.recovering || b.inflight >= b.cfg.MaxInFlight || b.sendSeq != b.nextSeq {
		return false
	}
	select {
	case <-b.lastSubmitted:
		return true
	default:
		return false
	}
}

// sendLocked proposes the next batches, in order, as far as MaxInFlight
// allows. The caller holds b.mu.
func (b *Batcher) sendLocked() {
	for !b.recovering && b.inflight < b.cfg.MaxInFlight && b.sendSeq < b.nextSeq {
		bt := b.window[b.sendSeq-b.base]
		bt.attempt++
		b.inflight++
		b.stats.Proposals++
		b.sendSeq++
		prev, mine := b.lastSubmitted, make(chan struct{})
		b.lastSubmitted = mine
		b.wg.Add(1)
		go b.propose(bt.seq, bt.attempt, bt.data, prev, mine)
	}
}

// submittedKey is the context key of the function Submitted calls.
type submittedKey struct{}

// Submitted tells the Batcher that called a ProposeFunc with ctx that the
// entry's place in the log is fixed: raft.Apply has returned its future,
// or the request to the leader went out on an ordered stream. The Batcher
// calls Propose for its next batch only then (or once Propose returns),
// so that batches are submitted, and committed, in the order they were
// made even with several in flight: goroutines started one after another
// do not run in that order. A ProposeFunc that never calls Submitted gets
// one proposal at a time. Submitted does nothing on any other ctx, and on
// its second call.
func Submitted(ctx context.Context) {
	if f, ok := ctx.Value(submittedKey{}).(func()); ok {
		f()
	}
}

// committedKey is the context key of the function Committed calls.
type committedKey struct{}

// WithCommitted returns a ctx on which Committed calls fn.
func WithCommitted(ctx context.Context, fn func(index uint64)) context.Context {
	return context.WithValue(ctx, committedKey{}, fn)
}

// Committed tells whoever called a ProposeFunc with ctx (a Batcher, or a
// WithCommitted ctx) the raft index at which the entry was committed, so
// that a node can wait until its own replica has applied that far
// (Batcher.CommittedIndex). RaftPropose calls it, and a forward to the
// leader should with the index the leader reports. It does nothing on any
// other ctx.
func Committed(ctx context.Context, index uint64) {
	if f, ok := ctx.Value(committedKey{}).(func(uint64)); ok {
		f(index)
	}
}

// propose calls Propose once, when the proposal before it was submitted,
// and hands the result to run. It closes submitted when Propose calls
// Submitted, or returns.
func (b *Batcher) propose(seq, attempt uint64, data []byte, prev <-chan struct{}, submitted chan struct{}) {
	defer b.wg.Done()
	select {
	case <-prev:
	case <-b.quit:
		return
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			close(submitted)
			b.kick() // a batch may be due
		})
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.ProposeTimeout)
	ctx = WithCommitted(context.WithValue(ctx, submittedKey{}, release), b.committedAt)
	err := b.cfg.Propose(ctx, data)
	release()
	cancel()
	select {
	case b.results <- proposal{seq: seq, attempt: attempt, err: err}:
	case <-b.quit:
	}
}

// handle takes the result of one proposal.
func (b *Batcher) handle(r proposal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	if r.seq < b.base {
		return // committed already: a stale duplicate
	}
	bt := b.window[r.seq-b.base]
	if r.attempt != bt.attempt {
		return // superseded by a later proposal of the batch
	}
	if r.err != nil {
		b.stats.Failures++
		if !b.recovering {
			b.recovering = true
			b.goBack = r.seq
			if b.failures == 0 {
				b.cfg.Logger.Warn("raftstore: proposing directory events failed; retrying", "batch", r.seq, "err", r.err)
			}
		}
		b.goBack = min(b.goBack, r.seq)
		return
	}
	bt.done = true
	if !b.recovering && b.failures > 0 {
		b.cfg.Logger.Info("raftstore: proposing directory events works again", "failures", b.stats.Failures)
		b.failures, b.backoffStep = 0, 0
	}
	advanced := false
	for len(b.window) > 0 && b.window[0].done {
		c := b.window[0]
		b.window[0] = nil
		b.window = b.window[1:]
		b.base++
		b.stats.Committed += uint64(c.events)
		b.stats.Batches++
		b.stats.Queued -= c.events
		advanced = true
	}
	if advanced {
		close(b.advanced)
		b.advanced = make(chan struct{})
	}
}

// backoffLocked returns how long to wait before resuming, and counts the
// failure. The caller holds b.mu.
func (b *Batcher) backoffLocked() time.Duration {
	d := b.cfg.RetryBackoff << min(b.backoffStep, 20)
	b.failures++
	b.backoffStep++
	return min(d, b.cfg.MaxRetryBackoff)
}

// resume proposes again from the batch that failed first: the batches
// after it too, committed or not, so that they are committed after it.
func (b *Batcher) resume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for seq := b.goBack; seq < b.sendSeq; seq++ {
		b.window[seq-b.base].done = false
		b.stats.Resent++
	}
	b.sendSeq = b.goBack
	b.recovering = false
}

// RaftPropose returns a ProposeFunc that applies data through r, which
// must be the leader (elsewhere it fails with an error wrapping
// raft.ErrNotLeader). Data that does not pass ValidateEntry never reaches
// the log: the error wraps ErrInvalidEntry. It calls Submitted once raft
// has queued the entry, and Committed with its index once it is
// committed, and returns once the entry is committed and applied on this
// node, with the FSM's business error if the entry was refused; ctx's
// deadline bounds the wait (raft goes on with the entry regardless).
func RaftPropose(r *raft.Raft) ProposeFunc {
	return func(ctx context.Context, data []byte) error {
		if err := ValidateEntry(data); err != nil {
			return fmt.Errorf("raftstore: propose: %w", err)
		}
		var timeout time.Duration
		if dl, ok := ctx.Deadline(); ok {
			if timeout = time.Until(dl); timeout <= 0 {
				return fmt.Errorf("raftstore: propose: %w", context.DeadlineExceeded)
			}
		}
		f := r.Apply(data, timeout)
		Submitted(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Error() }()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("raftstore: propose: %w", err)
			}
		case <-ctx.Done():
			return fmt.Errorf("raftstore: propose: %w", ctx.Err())
		}
		Committed(ctx, f.Index())
		if err, ok := f.Response().(error); ok {
			return err
		}
		return nil
	}
}

package raftstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

// outcome is what fakeLog does with one proposal.
type outcome int

const (
	commit       outcome = iota
	failBefore           // fail without committing (not the leader)
	failAfter            // commit, then fail (a timeout waiting for the commit)
	noSubmitting         // commit, without calling Submitted
)

// fakeLog commits proposals to an FSM in the order they are submitted, as
// a raft leader does, with failures and latency on demand.
type fakeLog struct {
	t        testing.TB
	mu       sync.Mutex
	fsm      *raftstore.FSM
	idx      uint64
	calls    int
	outcome  func(call int) outcome // nil: commit everything
	latency  time.Duration          // between submitting and returning
	gate     chan struct{}          // when set, proposals wait for it to close
	inflight atomic.Int32
	maxIn    atomic.Int32
}

func newFakeLog(t testing.TB) *fakeLog { return &fakeLog{t: t, fsm: raftstore.NewFSM()} }

func (l *fakeLog) propose(ctx context.Context, data []byte) error {
	n := l.inflight.Add(1)
	defer l.inflight.Add(-1)
	for m := l.maxIn.Load(); n > m && !l.maxIn.CompareAndSwap(m, n); m = l.maxIn.Load() {
	}
	if l.gate != nil {
		select {
		case <-l.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.mu.Lock()
	l.calls++
	o := commit
	if l.outcome != nil {
		o = l.outcome(l.calls)
	}
	if o != failBefore {
		l.idx++
		if res := l.fsm.Apply(&raft.Log{Index: l.idx, Type: raft.LogCommand, Data: data}); res != nil {
			l.t.Errorf("apply: %v", res)
		}
	}
	l.mu.Unlock()
	if o != noSubmitting {
		raftstore.Submitted(ctx)
	}
	time.Sleep(l.latency)
	if o == failBefore || o == failAfter {
		return errors.New("injected failure")
	}
	return nil
}

func newBatcher(t testing.TB, cfg raftstore.BatcherConfig) *raftstore.Batcher {
	t.Helper()
	cfg.Logger = quiet
	b, err := raftstore.NewBatcher(cfg)
	if err != nil {
		t.Fatalf("NewBatcher: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func addAll(t testing.TB, b *raftstore.Batcher, evs []raftstore.Event) {
	t.Helper()
	for _, ev := range evs {
		if !b.Add(ev) {
			t.Fatalf("Add dropped an event: %+v", b.Stats())
		}
	}
}

func flush(t testing.TB, b *raftstore.Batcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v (%+v)", err, b.Stats())
	}
}

// eventually waits up to 5s for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestBatcherProposesFullBatchesAtOnce(t *testing.T) {
	l := newFakeLog(t)
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxEvents: 100, MaxDelay: time.Hour})
	addAll(t, b, chainEvents(1, 250, n1DRAM))
	eventually(t, "two full batches", func() bool { return b.Stats().Batches == 2 })
	if s := b.Stats(); s.Committed != 200 || s.Queued != 50 {
		t.Fatalf("stats %+v, want 200 committed and 50 waiting", s)
	}
	flush(t, b)
	if s := b.Stats(); s.Batches != 3 || s.Committed != 250 || s.Queued != 0 {
		t.Fatalf("after Flush: %+v", s)
	}
}

func TestBatcherProposesAPartialBatchAfterMaxDelay(t *testing.T) {
	l := newFakeLog(t)
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxDelay: 5 * time.Millisecond})
	addAll(t, b, chainEvents(1, 3, n1DRAM))
	eventually(t, "the partial batch", func() bool { return b.Stats().Committed == 3 })
}

// Under a steady stream of events the batcher proposes a partial batch
// at most once a MinInterval, whatever MaxDelay says; a quiet batcher's
// first event goes after MaxDelay all the same, and Flush waits for
// neither.
func TestBatcherProposesPartialBatchesAtMostOnceAMinInterval(t *testing.T) {
	l := newFakeLog(t)
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxDelay: time.Millisecond,
		MinInterval: 20 * time.Millisecond})
	evs := chainEvents(1, 800, n1DRAM)
	start := time.Now()
	for i, ev := range evs { // 200ms of events, one every 250µs
		time.Sleep(time.Until(start.Add(time.Duration(i) * 250 * time.Microsecond)))
		addAll(t, b, []raftstore.Event{ev})
	}
	flush(t, b)
	took := time.Since(start)
	// One batch every 20ms at most, and one more sealed by Flush; with
	// MaxDelay alone there would be about 200.
	if s, most := b.Stats(), int(took/(20*time.Millisecond))+2; s.Committed != 800 || int(s.Batches) > most {
		t.Fatalf("%d events in %d batches over %v, want 800 in at most %d", s.Committed, s.Batches, took, most)
	}

	quiet := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxDelay: time.Millisecond,
		MinInterval: time.Hour})
	addAll(t, quiet, chainEvents(1000, 1, n1DRAM))
	eventually(t, "the first event, after MaxDelay", func() bool { return quiet.Stats().Committed == 1 })
	addAll(t, quiet, chainEvents(2000, 1, n1DRAM))
	time.Sleep(50 * time.Millisecond)
	if s := quiet.Stats(); s.Committed != 1 {
		t.Fatalf("a second event within MinInterval of the first batch was proposed: %+v", s)
	}
	flush(t, quiet)
	if s := quiet.Stats(); s.Committed != 2 || s.Batches != 2 {
		t.Fatalf("after Flush: %+v", s)
	}
}

func TestBatcherFlushWaitsForEverythingAddedBefore(t *testing.T) {
	l := newFakeLog(t)
	l.latency = time.Millisecond
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxEvents: 64, MaxInFlight: 4})
	flush(t, b) // nothing to wait for
	evs := chainEvents(1, 5000, n1DRAM)
	addAll(t, b, evs)
	flush(t, b)
	if n := l.fsm.Directory().Len(); n != len(evs) {
		t.Fatalf("after Flush the FSM holds %d blocks, want %d", n, len(evs))
	}
	if m := l.maxIn.Load(); m < 2 || m > 4 {
		t.Fatalf("at most %d proposals were in flight at once, want 2 to 4", m)
	}
}

func TestBatcherProposesOneAtATimeWithoutSubmitted(t *testing.T) {
	l := newFakeLog(t)
	l.latency = time.Millisecond
	l.outcome = func(int) outcome { return noSubmitting }
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxEvents: 16, MaxInFlight: 4})
	addAll(t, b, chainEvents(1, 500, n1DRAM))
	flush(t, b)
	if m := l.maxIn.Load(); m != 1 {
		t.Fatalf("%d proposals were in flight at once, want 1", m)
	}
}

func TestBatcherGrowsPartialBatchesWhileAProposalIsOutstanding(t *testing.T) {
	// A serial ProposeFunc (a follower forwarding to the leader) that takes
	// 10ms, fed an event every 250µs with MaxDelay 1ms: batches sealed by
	// time alone would pile up, one a millisecond, each costing 10ms.
	l := newFakeLog(t)
	l.latency = 10 * time.Millisecond
	l.outcome = func(int) outcome { return noSubmitting }
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxDelay: time.Millisecond})
	evs := chainEvents(1, 400, n1DRAM)
	start := time.Now()
	for i, ev := range evs {
		time.Sleep(time.Until(start.Add(time.Duration(i) * 250 * time.Microsecond)))
		addAll(t, b, []raftstore.Event{ev})
	}
	flush(t, b)
	// 100ms of events in 10ms round trips: about ten batches.
	if s := b.Stats(); s.Batches > 30 || s.Committed != 400 {
		t.Fatalf("%d events in %d batches, want 400 in about 10 (%+v)", s.Committed, s.Batches, s)
	}
	if lag := time.Since(start) - 100*time.Millisecond; lag > 250*time.Millisecond {
		t.Fatalf("the last events were committed %v after they were added", lag)
	}
}

func TestBatcherRetriesFailuresAndEndsWithEventsInOrder(t *testing.T) {
	l := newFakeLog(t)
	l.latency = 200 * time.Microsecond
	l.outcome = func(call int) outcome {
		switch {
		case call%7 == 0:
			return failBefore
		case call%11 == 0:
			return failAfter
		}
		return commit
	}
	b := newBatcher(t, raftstore.BatcherConfig{
		Propose: l.propose, MaxEvents: 50, MaxInFlight: 4,
		RetryBackoff: time.Millisecond, MaxRetryBackoff: 4 * time.Millisecond,
	})
	// Events over few keys, so that later batches undo earlier ones: only
	// an in-order end state matches the reference.
	evs := randomEventsSeed(21, 4000)
	for i := range evs {
		evs[i].Key.Hash %= 64
	}
	addAll(t, b, evs)
	flush(t, b)
	want := index.NewDirectory()
	want.ApplyBatch(evs)
	if got := dumpDir(l.fsm.Directory()); got != dumpDir(want) {
		t.Fatalf("directory after retries differs from the events applied in order:\n%s\nwant\n%s", got, dumpDir(want))
	}
	s := b.Stats()
	if s.Failures == 0 || s.Resent == 0 || s.Committed != uint64(len(evs)) || s.Proposals < s.Batches+s.Failures {
		t.Fatalf("stats %+v", s)
	}
}

func TestBatcherDropsEventsWhenTheQueueIsFull(t *testing.T) {
	l := newFakeLog(t)
	l.gate = make(chan struct{})
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, MaxEvents: 10, QueueSize: 100})
	taken := 0
	for _, ev := range chainEvents(1, 150, n1DRAM) {
		if b.Add(ev) {
			taken++
		}
	}
	if s := b.Stats(); taken != 100 || s.Dropped != 50 || s.Queued != 100 {
		t.Fatalf("took %d events, stats %+v; want 100 taken, 50 dropped", taken, s)
	}
	close(l.gate)
	flush(t, b)
	if s := b.Stats(); s.Committed != 100 || s.Queued != 0 {
		t.Fatalf("after Flush: %+v", s)
	}
	// Room again.
	if !b.Add(chainEvents(2, 1, n1DRAM)[0]) {
		t.Fatal("Add dropped an event with the queue empty")
	}
}

func TestBatcherFlushHonoursItsContextAndClose(t *testing.T) {
	l := newFakeLog(t)
	l.gate = make(chan struct{}) // never opens
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose})
	addAll(t, b, chainEvents(1, 10, n1DRAM))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with the log stuck = %v, want DeadlineExceeded", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Flush(context.Background()); !errors.Is(err, raftstore.ErrClosed) {
		t.Fatalf("Flush after Close = %v, want ErrClosed", err)
	}
	if b.Add(chainEvents(2, 1, n1DRAM)[0]) || b.Stats().Dropped != 1 {
		t.Fatal("Add after Close took an event")
	}
	if err := b.Close(); !errors.Is(err, raftstore.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}

func TestNewBatcherReportsEveryBadField(t *testing.T) {
	_, err := raftstore.NewBatcher(raftstore.BatcherConfig{MaxEvents: -1, MaxDelay: -1, MinInterval: -1, QueueSize: -5})
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, field := range []string{"Propose", "MaxEvents", "MaxDelay", "MinInterval", "QueueSize"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not mention %s", err, field)
		}
	}
}

// RetryNow ends the wait after a failure: the batch is proposed again
// without waiting out a backoff whose cause is gone (a new leader).
func TestBatcherRetryNowEndsTheBackoff(t *testing.T) {
	l := newFakeLog(t)
	l.outcome = func(call int) outcome {
		if call == 1 {
			return failBefore
		}
		return commit
	}
	const backoff = time.Hour
	b := newBatcher(t, raftstore.BatcherConfig{Propose: l.propose, RetryBackoff: backoff, MaxRetryBackoff: backoff})
	addAll(t, b, chainEvents(1, 8, n1DRAM))
	eventually(t, "the first proposal to fail", func() bool { return b.Stats().Failures == 1 })
	b.RetryNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Flush(ctx); err != nil {
		t.Fatalf("after RetryNow the batch is not proposed again within 10s, with a backoff of %v: %v (%+v)", backoff, err, b.Stats())
	}
	if s := b.Stats(); s.Proposals != 2 || s.Committed != 8 {
		t.Fatalf("stats %+v, want 2 proposals and 8 events committed", s)
	}
}

package replay

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/trace"
)

// fakeClock is virtual time: SleepUntil jumps to the instant asked, and
// the test moves time with advance. It counts the reads of Now so that a
// scripted server can wait until the client has stamped an event.
type fakeClock struct {
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	reads  int
	sleeps []time.Time
	// gate, if set, is called as SleepUntil is entered, with the number
	// of calls before: a test waits there until the requests scheduled
	// before have been sent, so that virtual time moves on only then.
	gate func(k int)
}

func newFakeClock() *fakeClock {
	c := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	c.cond.Broadcast()
	return c.now
}

func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	k := len(c.sleeps)
	c.mu.Unlock()
	if c.gate != nil {
		c.gate(k)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, t)
	if t.After(c.now) {
		c.now = t
	}
	return ctx.Err()
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) readCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// waitReads waits until Now has been read n times in all.
func (c *fakeClock) waitReads(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.reads < n {
		c.cond.Wait()
	}
}

// waitCount waits until k entries of sentAt are set.
func waitCount(mu *sync.Mutex, sentAt []time.Time, k int) {
	for {
		mu.Lock()
		n := 0
		for _, t := range sentAt {
			if !t.IsZero() {
				n++
			}
		}
		mu.Unlock()
		if n >= k {
			return
		}
		runtime.Gosched()
	}
}

func TestRunSendsEachRequestAtItsTimestampDividedBySpeedup(t *testing.T) {
	clock := newFakeClock()
	start := clock.now
	reqs := []trace.Request{{Timestamp: 0}, {Timestamp: 0}, {Timestamp: 1000}, {Timestamp: 2500}, {Timestamp: 60000}}
	var mu sync.Mutex
	sentAt := make([]time.Time, len(reqs))
	clock.gate = func(k int) { waitCount(&mu, sentAt, k) }
	rep, err := Run(context.Background(), reqs, Config{Speedup: 4, Clock: clock}, func(_ context.Context, i int, _ trace.Request) Result {
		now := clock.Now()
		mu.Lock()
		sentAt[i] = now
		mu.Unlock()
		return Result{Sent: now}
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []time.Duration{0, 0, 250 * time.Millisecond, 625 * time.Millisecond, 15 * time.Second} {
		if got := sentAt[i].Sub(start); got != want {
			t.Errorf("request %d (at %d ms in the trace) sent at %v, want %v", i, reqs[i].Timestamp, got, want)
		}
	}
	if rep.Sent != 5 || rep.Completed != 5 || rep.Waited != 0 || rep.Speedup != 4 {
		t.Errorf("report %+v", rep)
	}
}

// The schedule is open-loop: a request still running does not hold back
// the next one, until MaxInFlight are running; then the next waits, and is
// counted.
func TestRunDoesNotWaitForEarlierRequestsButCountsThoseOverTheCap(t *testing.T) {
	clock := newFakeClock()
	reqs := []trace.Request{{Timestamp: 0}, {Timestamp: 10}, {Timestamp: 20}}
	release := make(chan struct{})
	started := make(chan int, 3)
	done := make(chan *Report)
	go func() {
		rep, _ := Run(context.Background(), reqs, Config{MaxInFlight: 2, Clock: clock}, func(_ context.Context, i int, _ trace.Request) Result {
			started <- i
			<-release
			return Result{}
		})
		done <- rep
	}()
	// The first two run at once, neither finished.
	got := map[int]bool{<-started: true, <-started: true}
	if !got[0] || !got[1] {
		t.Fatalf("started %v, want requests 0 and 1 while both run", got)
	}
	// Request 2's time has come (its sleep is over) while both slots are
	// held; the scheduler then finds no slot and waits. Nothing tells the
	// test it got there, so it gives it a moment before freeing the slots.
	for {
		clock.mu.Lock()
		n := len(clock.sleeps)
		clock.mu.Unlock()
		if n == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case i := <-started:
		t.Fatalf("request %d started over the cap of 2", i)
	default:
	}
	close(release)
	if i := <-started; i != 2 {
		t.Fatalf("started request %d, want 2", i)
	}
	rep := <-done
	if rep.Waited != 1 || rep.Completed != 3 {
		t.Errorf("waited %d, completed %d; want 1 and 3", rep.Waited, rep.Completed)
	}
}

func TestRunStopsSendingWhenItsContextEnds(t *testing.T) {
	clock := newFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	reqs := []trace.Request{{Timestamp: 0}, {Timestamp: 10}, {Timestamp: 20}}
	sent := make(chan struct{}, len(reqs))
	clock.gate = func(k int) {
		if k > 0 {
			<-sent // the previous request was sent (and cancelled the replay)
		}
	}
	rep, err := Run(ctx, reqs, Config{Clock: clock}, func(_ context.Context, i int, _ trace.Request) Result {
		if i == 0 {
			cancel()
		}
		sent <- struct{}{}
		return Result{}
	})
	if !errors.Is(err, context.Canceled) || rep.Sent != 1 || rep.Requests != 3 {
		t.Errorf("err %v, sent %d of %d; want Canceled, 1 of 3", err, rep.Sent, rep.Requests)
	}
}

func TestRunRefusesABadConfig(t *testing.T) {
	for _, c := range []Config{{Speedup: -1}, {MaxInFlight: -3}} {
		if _, err := Run(context.Background(), nil, c, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: error %v, want ErrConfig", c, err)
		}
	}
}

package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/lifecycle"
)

// journal records what the parts of one test did, in order.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	j.lines = append(j.lines, s)
	j.mu.Unlock()
}

func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// part is a Part that writes what is done to it in a journal.
type part struct {
	name     string
	j        *journal
	startErr error
	fail     chan error
	// waitStop makes Stop wait for its context to end, as a part whose
	// requests in flight do not finish.
	waitStop bool
	ready    error
}

func newPart(j *journal, name string) *part {
	return &part{name: name, j: j, fail: make(chan error, 1)}
}

func (p *part) Name() string { return p.name }

func (p *part) Start(context.Context) error {
	if p.startErr != nil {
		p.j.add("start " + p.name + " failed")
		return p.startErr
	}
	p.j.add("start " + p.name)
	return nil
}

func (p *part) Failed() <-chan error { return p.fail }

func (p *part) Stop(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		p.j.add("stop " + p.name + " without a deadline")
	}
	if p.waitStop {
		<-ctx.Done()
		p.j.add("stop " + p.name + " cut")
		return ctx.Err()
	}
	p.j.add("stop " + p.name)
	return nil
}

func (p *part) Ready() error { return p.ready }

func newRunner(t *testing.T, timeout time.Duration, parts ...lifecycle.Part) *lifecycle.Runner {
	t.Helper()
	r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: timeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, parts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs r in the background; the returned func asks it to stop and
// returns Run's result.
func run(r *lifecycle.Runner) (stop func() error, done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- r.Run(ctx) }()
	return func() error { cancel(); return <-ch }, ch
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10s", what)
		}
	}
}

func TestPartsStartInOrderAndStopInReverse(t *testing.T) {
	j := &journal{}
	r := newRunner(t, time.Minute, newPart(j, "node"), newPart(j, "workers"), newPart(j, "frontend"))
	stop, _ := run(r)
	waitFor(t, "ready", func() bool { return r.Ready() == nil })
	if err := stop(); err != nil {
		t.Fatalf("a stop asked for: %v", err)
	}
	want := []string{"start node", "start workers", "start frontend", "stop frontend", "stop workers", "stop node"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestAFailedStartStopsWhatStartedBeforeIt(t *testing.T) {
	j := &journal{}
	bad := newPart(j, "workers")
	bad.startErr = errors.New("no GPU")
	r := newRunner(t, time.Minute, newPart(j, "node"), bad, newPart(j, "frontend"))
	if err := r.Run(context.Background()); !errors.Is(err, bad.startErr) {
		t.Fatalf("Run: %v, want the start's error", err)
	}
	want := []string{"start node", "start workers failed", "stop node"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestAPartFailingWhileRunningStopsTheWhole(t *testing.T) {
	j := &journal{}
	frontend := newPart(j, "frontend")
	r := newRunner(t, time.Minute, newPart(j, "node"), frontend)
	_, done := run(r)
	waitFor(t, "ready", func() bool { return r.Ready() == nil })
	broke := errors.New("listener closed")
	frontend.fail <- broke
	if err := <-done; !errors.Is(err, broke) {
		t.Fatalf("Run: %v, want the failure", err)
	}
	want := []string{"start node", "start frontend", "stop frontend", "stop node"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if err := r.Ready(); !errors.Is(err, lifecycle.ErrNotRunning) {
		t.Fatalf("Ready after the run: %v", err)
	}
}

// One deadline bounds the whole shutdown: a part that does not finish
// by it is cut, and the parts after it still stop (at once: their
// deadline has passed too).
func TestShutdownDeadlineCutsAPartThatHangs(t *testing.T) {
	j := &journal{}
	hung := newPart(j, "frontend")
	hung.waitStop = true
	r := newRunner(t, 50*time.Millisecond, newPart(j, "node"), hung)
	stop, _ := run(r)
	waitFor(t, "ready", func() bool { return r.Ready() == nil })
	if err := stop(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want the hung stop's deadline", err)
	}
	want := []string{"start node", "start frontend", "stop frontend cut", "stop node"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestReadyAggregatesTheParts(t *testing.T) {
	j := &journal{}
	node, frontend := newPart(j, "node"), newPart(j, "frontend")
	r := newRunner(t, time.Minute, node, frontend)
	if err := r.Ready(); !errors.Is(err, lifecycle.ErrNotRunning) {
		t.Fatalf("Ready before Run: %v", err)
	}
	stop, _ := run(r)
	waitFor(t, "ready", func() bool { return r.Ready() == nil })
	frontend.ready = errors.New("no workers yet")
	if err := r.Ready(); !errors.Is(err, frontend.ready) {
		t.Fatalf("Ready with a part not ready: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	var c lifecycle.Config
	c.EnsureDefaults()
	if c.ShutdownTimeout != lifecycle.DefaultShutdownTimeout || c.Logger == nil || c.Validate() != nil {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: -time.Second}); err == nil {
		t.Fatal("a negative ShutdownTimeout was accepted")
	}
}

package local

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

// fakeWorker records what is done to it, in order, in its deployment's
// log. A Drain waits for release, or its context.
type fakeWorker struct {
	d    *deployment
	url  string
	pool planner.Pool
}

func (w *fakeWorker) URL() string        { return w.url }
func (w *fakeWorker) Role() planner.Pool { return w.pool }
func (w *fakeWorker) Drain(ctx context.Context) (DrainReport, error) {
	w.d.record("drain " + w.url)
	select {
	case <-w.d.drainGate:
		return DrainReport{InFlight: 1, Offloaded: 3}, nil
	case <-ctx.Done():
		return DrainReport{Dropped: 3}, ctx.Err()
	}
}
func (w *fakeWorker) Stop(context.Context) error {
	w.d.record("stop " + w.url)
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	w.d.stopped[w.url]++
	return nil
}

// deployment is a fake Spawner and Router (with loads): spawns wait for
// spawnGate, drains for drainGate (closed: no wait).
type deployment struct {
	spawnGate, drainGate chan struct{}
	spawnErr             error

	mu      sync.Mutex
	log     []string
	n       int
	spawned []string
	routed  map[string]bool
	stopped map[string]int
	load    map[string]int
}

func newDeployment() *deployment {
	open := make(chan struct{})
	close(open)
	return &deployment{spawnGate: open, drainGate: open, routed: map[string]bool{}, stopped: map[string]int{}, load: map[string]int{}}
}

func (d *deployment) record(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log = append(d.log, s)
}

func (d *deployment) Spawn(ctx context.Context, pool planner.Pool) (Worker, error) {
	select {
	case <-d.spawnGate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.spawnErr != nil {
		return nil, d.spawnErr
	}
	d.n++
	w := &fakeWorker{d: d, url: fmt.Sprintf("http://w%d", d.n), pool: pool}
	d.spawned = append(d.spawned, w.url)
	return w, nil
}

func (d *deployment) AddWorker(w Worker) error {
	d.record("add " + w.URL())
	d.mu.Lock()
	defer d.mu.Unlock()
	d.routed[w.URL()] = true
	return nil
}

func (d *deployment) RemoveWorker(url string) bool {
	d.record("remove " + url)
	d.mu.Lock()
	defer d.mu.Unlock()
	had := d.routed[url]
	delete(d.routed, url)
	return had
}

func (d *deployment) Load(url string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.load[url]
}

func newConnector(t *testing.T, d *deployment, tune func(*Config)) *Connector {
	t.Helper()
	cfg := Config{Spawner: d, Router: d, Pools: []planner.Pool{planner.Aggregated}, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	if tune != nil {
		tune(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

func replicas(t *testing.T, c *Connector) planner.Replicas {
	t.Helper()
	r, err := c.Replicas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r[planner.Aggregated]
}

// eventually polls cond until it holds, failing after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("still not true after a minute: %s", what)
		}
	}
}

// A scale-up counts its starting workers as desired at once, and as ready,
// in the router, only once they were spawned.
func TestScaleUpCountsStartingWorkersAndRoutesThemOnceSpawned(t *testing.T) {
	d := newDeployment()
	d.spawnGate = make(chan struct{})
	c := newConnector(t, d, nil)
	if err := c.Scale(context.Background(), planner.Aggregated, 2); err != nil {
		t.Fatal(err)
	}
	if r := replicas(t, c); r != (planner.Replicas{Desired: 2, Ready: 0}) {
		t.Fatalf("while spawning: %+v, want desired 2, ready 0", r)
	}
	close(d.spawnGate)
	eventually(t, "both workers ready", func() bool { return replicas(t, c) == planner.Replicas{Desired: 2, Ready: 2} })
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.routed) != 2 {
		t.Fatalf("routed %v, want both workers", d.routed)
	}
}

// A scale-down takes the least loaded worker first, the newest among
// equals; each goes out of the router, is drained, then stopped, in that
// order; Replicas counts it out at once, while it still drains.
func TestScaleDownDrainsTheLeastLoadedNewestFirstInTheBackground(t *testing.T) {
	d := newDeployment()
	c := newConnector(t, d, nil)
	if err := c.Scale(context.Background(), planner.Aggregated, 4); err != nil {
		t.Fatal(err)
	}
	eventually(t, "4 workers ready", func() bool { return replicas(t, c).Ready == 4 })
	d.mu.Lock()
	spawned := slices.Clone(d.spawned)
	d.load[spawned[3]] = 2 // the newest is busy
	d.load[spawned[2]] = 0
	d.load[spawned[1]] = 0
	d.load[spawned[0]] = 1
	d.log = nil
	d.drainGate = make(chan struct{})
	d.mu.Unlock()

	if err := c.Scale(context.Background(), planner.Aggregated, 2); err != nil {
		t.Fatal(err)
	}
	if r := replicas(t, c); r != (planner.Replicas{Desired: 2, Ready: 2}) {
		t.Fatalf("while draining: %+v, want 2 and 2", r)
	}
	var draining []string
	for _, w := range c.Status().Workers {
		if w.State == Draining {
			draining = append(draining, w.URL)
		}
	}
	slices.Sort(draining)
	if want := []string{spawned[1], spawned[2]}; !slices.Equal(draining, want) {
		t.Fatalf("draining %v, want the idle ones %v", draining, want)
	}
	close(d.drainGate)
	eventually(t, "both drained and stopped", func() bool { return len(c.Status().Drained) == 2 })
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, url := range draining {
		var steps []string
		for _, s := range d.log {
			if s == "remove "+url || s == "drain "+url || s == "stop "+url {
				steps = append(steps, s[:len(s)-len(url)-1])
			}
		}
		if !slices.Equal(steps, []string{"remove", "drain", "stop"}) || d.stopped[url] != 1 {
			t.Fatalf("%s: %v, stopped %d times; want remove, drain, stop, once", url, steps, d.stopped[url])
		}
	}
	if c.Status().Errors != 0 {
		t.Fatalf("errors %d, want 0", c.Status().Errors)
	}
}

// A scale-down while workers still start cancels those first; one that
// was spawned all the same is stopped, never routed.
func TestScaleDownCancelsStartingWorkersFirst(t *testing.T) {
	d := newDeployment()
	c := newConnector(t, d, nil)
	if err := c.Scale(context.Background(), planner.Aggregated, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "1 worker ready", func() bool { return replicas(t, c).Ready == 1 })
	d.mu.Lock()
	d.spawnGate = make(chan struct{})
	d.mu.Unlock()
	if err := c.Scale(context.Background(), planner.Aggregated, 3); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(context.Background(), planner.Aggregated, 1); err != nil {
		t.Fatal(err)
	}
	if r := replicas(t, c); r != (planner.Replicas{Desired: 1, Ready: 1}) {
		t.Fatalf("%+v, want the serving worker only", r)
	}
	eventually(t, "the cancelled spawns forgotten", func() bool { return len(c.Status().Workers) == 1 })
	if st := c.Status(); st.Workers[0].State != Serving || len(st.Drained) != 0 {
		t.Fatalf("%+v: want the first worker serving and nothing drained", st)
	}
}

// Bad input is an error that changes nothing; failures are counted and
// leave no worker behind.
func TestBadScaleAndFailedSpawns(t *testing.T) {
	d := newDeployment()
	c := newConnector(t, d, nil)
	if err := c.Scale(context.Background(), planner.Decode, 1); !errors.Is(err, ErrUnknownPool) {
		t.Fatalf("Scale(decode) = %v, want ErrUnknownPool", err)
	}
	if err := c.Scale(context.Background(), planner.Aggregated, -1); !errors.Is(err, ErrBadCount) {
		t.Fatalf("Scale(-1) = %v, want ErrBadCount", err)
	}
	if st := c.Status(); len(st.Workers) != 0 {
		t.Fatalf("workers %+v after bad scales, want none", st.Workers)
	}
	d.mu.Lock()
	d.spawnErr = errors.New("no port")
	d.mu.Unlock()
	if err := c.Scale(context.Background(), planner.Aggregated, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both spawn failures counted", func() bool { return c.Status().Errors == 2 })
	eventually(t, "the failed spawns forgotten", func() bool { return replicas(t, c) == planner.Replicas{} })
	if _, err := New(Config{}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("New(Config{}) = %v, want ErrBadConfig", err)
	}
}

// A drain past DrainTimeout is cut, counted as an error with what it
// dropped, and its worker stopped all the same.
func TestADrainPastItsTimeoutIsCutAndTheWorkerStopped(t *testing.T) {
	d := newDeployment()
	c := newConnector(t, d, func(cfg *Config) { cfg.DrainTimeout = 50 * time.Millisecond })
	if err := c.Scale(context.Background(), planner.Aggregated, 1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "1 worker ready", func() bool { return replicas(t, c).Ready == 1 })
	d.mu.Lock()
	d.drainGate = make(chan struct{}) // never released
	d.mu.Unlock()
	if err := c.Scale(context.Background(), planner.Aggregated, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the drain ended", func() bool { return len(c.Status().Drained) == 1 })
	st := c.Status()
	if dr := st.Drained[0]; dr.Err == "" || dr.Report.Dropped != 3 || st.Errors != 1 || len(st.Workers) != 0 {
		t.Fatalf("%+v: want the drain's error and dropped blocks reported, 1 error, no worker left", st)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped[d.spawned[0]] != 1 {
		t.Fatal("the worker whose drain was cut was not stopped")
	}
}

// Scale and Replicas from many goroutines at once (run with -race): at
// the end every worker ever spawned is either serving or was stopped
// exactly once, and Close stops the rest.
func TestConcurrentScalesLoseNoWorker(t *testing.T) {
	d := newDeployment()
	c := newConnector(t, d, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 50 {
				if err := c.Scale(context.Background(), planner.Aggregated, r.IntN(5)); err != nil {
					t.Error(err)
				}
				replicas(t, c)
				c.Status()
			}
		})
	}
	wg.Wait()
	if err := c.Scale(context.Background(), planner.Aggregated, 2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "settled at 2", func() bool {
		st := c.Status()
		return len(st.Workers) == 2 && replicas(t, c) == planner.Replicas{Desired: 2, Ready: 2}
	})
	d.mu.Lock()
	for _, url := range d.spawned {
		if n := d.stopped[url]; n > 1 || (n == 0) != d.routed[url] {
			t.Errorf("%s: stopped %d times, routed %v; want stopped once or serving", url, n, d.routed[url])
		}
	}
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, url := range d.spawned {
		if d.stopped[url] != 1 {
			t.Errorf("%s stopped %d times after Close, want once", url, d.stopped[url])
		}
	}
	if err := c.Scale(context.Background(), planner.Aggregated, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Scale after Close = %v, want ErrClosed", err)
	}
}

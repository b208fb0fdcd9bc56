// Package loadgen is the load generator behind kvctl bench: it drives a
// Target (a kvstrata node through the Go client, or a Redis server through
// a minimal RESP2 client of its own) with puts, gets, lookups or a mix, from
// a number of concurrent workers, for a duration or a number of requests,
// and reports throughput and a latency histogram. Every value it puts is
// deterministic per key (see Content), and every get compares the bytes it
// read with them, so a run measures only correct answers and counts wrong
// ones as errors.
//
// Concurrency: Run starts Config.Concurrency workers, each with its own
// Target opened by the Dialer, its own random source and its own
// Histogram; workers share only atomic counters (the requests handed out,
// and progress). Their results are merged once all of them have stopped.
// The Progress callback is called from one goroutine, Run's own ticker. A
// Target need not be safe for concurrent use; a Dialer must be.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Op is the kind of request a run makes.
type Op string

// The operations.
const (
	OpPut    Op = "put"    // store values
	OpGet    Op = "get"    // read values back and check them
	OpLookup Op = "lookup" // longest-prefix lookups (kvstrata only)
	OpMixed  Op = "mixed"  // gets and puts, GetRatio of them gets
)

// Ops lists the operations, for help texts.
var Ops = []Op{OpPut, OpGet, OpLookup, OpMixed}

// ErrUnsupported marks an operation the target cannot do.
var ErrUnsupported = errors.New("loadgen: operation not supported by the target")

// Config describes a run. Zero fields take the defaults said.
type Config struct {
	// Op is what each request does. Get, lookup and mixed runs first put
	// every key of the working set (the populate phase, reported apart),
	// unless NoPopulate.
	Op Op
	// NoPopulate skips the populate phase: the run reads what an earlier
	// run put (a put run with the same keys, namespace and value size),
	// for instance after the node's page cache was dropped.
	NoPopulate bool
	// GetRatio is the share of a mixed run's requests that are gets, in
	// [0, 1]; the others are puts. Only for OpMixed.
	GetRatio float64
	// ValueSize is the size of every value, in bytes.
	ValueSize int
	// Keys is the size of the working set; requests pick their keys in it.
	// The default is 1024.
	Keys int
	// Batch is the number of keys per request. The default is 1.
	Batch int
	// Concurrency is the number of workers, each with one request in
	// flight. The default is 8.
	Concurrency int
	// Requests ends the run after this many requests, if not 0; else the
	// run lasts Duration, default 10 seconds. Requests already sent when
	// the time is up finish and count.
	Requests int64
	Duration time.Duration
	// Seed makes the values and the keys picked; runs with the same seed
	// put the same bytes.
	Seed uint64
	// Progress, if not nil, is called about ten times a second while a
	// phase runs, and once at its end.
	Progress func(Progress)
}

// Progress is the state of the phase in progress.
type Progress struct {
	Phase    string // "populate" or "run"
	Requests int64  // requests done
	Total    int64  // requests the phase makes; 0 when bound by time
	Bytes    int64
	Elapsed  time.Duration
	Duration time.Duration // the phase's length when bound by time
}

// EnsureDefaults fills c's zero fields with their defaults.
func (c *Config) EnsureDefaults() {
	if c.Keys == 0 {
		c.Keys = 1024
	}
	if c.Batch == 0 {
		c.Batch = 1
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.Requests == 0 && c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
}

// Validate reports every problem with c in one error. Call it after
// EnsureDefaults: a zero Keys, Batch or Concurrency is a problem.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	switch c.Op {
	case OpPut, OpGet, OpLookup, OpMixed:
	default:
		bad("unknown op %q (want put, get, lookup or mixed)", c.Op)
	}
	if c.GetRatio < 0 || c.GetRatio > 1 {
		bad("get ratio %v outside [0, 1]", c.GetRatio)
	}
	if c.ValueSize < 0 {
		bad("value size %d is negative", c.ValueSize)
	}
	if c.Keys < 1 {
		bad("%d keys: need at least 1", c.Keys)
	}
	if c.Batch < 1 || c.Batch > c.Keys {
		bad("batch of %d keys outside [1, keys = %d]", c.Batch, c.Keys)
	}
	if c.Concurrency < 1 {
		bad("concurrency %d: need at least 1", c.Concurrency)
	}
	if c.Requests < 0 || c.Duration < 0 {
		bad("negative requests or duration")
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("loadgen: %s", strings.Join(probs, "; "))
}

// Report is what a run measured.
type Report struct {
	Populate *Result // nil for a put run
	Run      Result
}

// Result is what one phase measured.
type Result struct {
	Requests int64         // requests made, failed ones included
	Blocks   int64         // values moved (or keys found by lookups)
	Bytes    int64         // value bytes moved
	Elapsed  time.Duration // from the phase's start until its last request ended
	// Errors counts failed requests, values that came back wrong, and
	// workers that stopped because they could not reopen their target
	// after a failure; Mismatches counts the wrong values alone.
	Errors     int64
	Mismatches int64
	// Misses counts keys a get or lookup did not find: they were evicted
	// (or, in a mixed run, not put yet). Not an error.
	Misses     int64
	FirstError error
	// Latency holds the durations of the requests that succeeded.
	Latency *Histogram
	// GetLatency holds those of the gets alone (in a mixed run, the
	// share of Latency that is gets; in a get run, all of it).
	GetLatency *Histogram
}

// OpsPerSec is the rate of values moved (or keys found).
func (r *Result) OpsPerSec() float64 { return perSec(r.Blocks, r.Elapsed) }

// RequestsPerSec is the rate of requests.
func (r *Result) RequestsPerSec() float64 { return perSec(r.Requests, r.Elapsed) }

// BytesPerSec is the rate of value bytes moved.
func (r *Result) BytesPerSec() float64 { return perSec(r.Bytes, r.Elapsed) }

func perSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func (r *Result) merge(o *Result) {
	r.Requests += o.Requests
	r.Blocks += o.Blocks
	r.Bytes += o.Bytes
	r.Errors += o.Errors
	r.Mismatches += o.Mismatches
	r.Misses += o.Misses
	if r.FirstError == nil {
		r.FirstError = o.FirstError
	}
	r.Latency.Merge(o.Latency)
	r.GetLatency.Merge(o.GetLatency)
}

// Run runs cfg against the targets dial opens, one per worker, and
// returns what it measured. When ctx is cancelled the workers stop after
// their requests in flight, and Run returns the report so far with ctx's
// error. Run fails before any request when cfg is invalid, a target cannot
// be opened, or the target cannot do cfg.Op.
func Run(ctx context.Context, dial Dialer, cfg Config) (*Report, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	content, err := NewContent(cfg.ValueSize, cfg.Seed)
	if err != nil {
		return nil, err
	}
	workers := make([]*worker, 0, cfg.Concurrency)
	defer func() {
		for _, w := range workers {
			if w.t != nil {
				w.t.Close()
			}
		}
	}()
	for i := range cfg.Concurrency {
		t, err := dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("loadgen: open target %d of %d: %w", i+1, cfg.Concurrency, err)
		}
		workers = append(workers, newWorker(i, t, dial, content, &cfg))
	}
	if _, ok := workers[0].t.(Looker); cfg.Op == OpLookup && !ok {
		return nil, fmt.Errorf("%w: lookup", ErrUnsupported)
	}

	rep := &Report{Run: Result{Latency: new(Histogram), GetLatency: new(Histogram)}} // what an interrupted populate leaves
	if cfg.Op != OpPut && !cfg.NoPopulate {
		var next atomic.Int64
		batches := (int64(cfg.Keys) + int64(cfg.Batch) - 1) / int64(cfg.Batch)
		res := runPhase(ctx, workers, &cfg, phase{name: "populate", total: batches}, func(w *worker) (kind, bool) {
			from := (next.Add(1) - 1) * int64(cfg.Batch)
			if from >= int64(cfg.Keys) {
				return 0, false
			}
			w.keys = w.keys[:0]
			for k := from; k < min(from+int64(cfg.Batch), int64(cfg.Keys)); k++ {
				w.keys = append(w.keys, uint64(k))
			}
			return kindPut, true
		})
		rep.Populate = &res
		if err := ctx.Err(); err != nil {
			return rep, err
		}
	}

	var handed, puts atomic.Int64
	p := phase{name: "run", total: cfg.Requests, start: time.Now()}
	end := p.start.Add(cfg.Duration) // used only when bound by time
	if cfg.Requests == 0 {
		p.duration = cfg.Duration
	}
	rep.Run = runPhase(ctx, workers, &cfg, p, func(w *worker) (kind, bool) {
		if cfg.Requests > 0 {
			if handed.Add(1) > cfg.Requests {
				return 0, false
			}
		} else if !time.Now().Before(end) {
			return 0, false
		}
		k := kindGet
		switch cfg.Op {
		case OpPut:
			k = kindPut
		case OpLookup:
			k = kindLookup
		case OpMixed:
			if w.rng.Float64() >= cfg.GetRatio {
				k = kindPut
			}
		}
		var from uint64
		if k == kindPut && cfg.Op == OpPut { // a put run writes the keys in turn
			from = uint64(puts.Add(1)-1) * uint64(cfg.Batch)
		} else {
			from = w.rng.Uint64N(uint64(cfg.Keys))
		}
		w.keys = w.keys[:0]
		for i := range uint64(cfg.Batch) {
			w.keys = append(w.keys, (from+i)%uint64(cfg.Keys))
		}
		return k, true
	})
	return rep, ctx.Err()
}

// phase names a phase and says how long it lasts, for Progress.
type phase struct {
	name     string
	total    int64
	duration time.Duration
	// start, if set, is when the phase began: a phase bound by time
	// measures its end from it, and its Elapsed must too.
	start time.Time
}

// runPhase runs the workers until next says stop (or ctx is done) and
// merges their results.
func runPhase(ctx context.Context, workers []*worker, cfg *Config, p phase, next func(*worker) (kind, bool)) Result {
	var requests, bytes atomic.Int64
	start := p.start
	if start.IsZero() {
		start = time.Now()
	}
	var wg sync.WaitGroup
	for _, w := range workers {
		w.res = Result{Latency: w.res.Latency, GetLatency: w.res.GetLatency}
		*w.res.Latency, *w.res.GetLatency = Histogram{}, Histogram{}
		wg.Go(func() { w.loop(ctx, next, &requests, &bytes) })
	}
	report := func() {
		if cfg.Progress != nil {
			cfg.Progress(Progress{Phase: p.name, Requests: requests.Load(), Total: p.total, Bytes: bytes.Load(),
				Elapsed: time.Since(start), Duration: p.duration})
		}
	}
	if cfg.Progress != nil {
		done := make(chan struct{})
		var tick sync.WaitGroup
		tick.Go(func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					report()
				}
			}
		})
		wg.Wait()
		close(done)
		tick.Wait()
	} else {
		wg.Wait()
	}
	out := Result{Elapsed: time.Since(start), Latency: new(Histogram), GetLatency: new(Histogram)}
	for _, w := range workers {
		out.merge(&w.res)
	}
	report()
	return out
}

// Package replay replays a request trace (package trace, the Mooncake
// format) against a live OpenAI-compatible deployment and measures what a
// user of it sees: time to first token, inter-token latency, end-to-end
// latency, throughput and prefix-cache hits. It is the live half of
// `kvctl replay`.
//
// The pieces, each usable alone:
//
//   - Prompts turns a request's hash ids into token ids, the same tokens
//     for the same hash id, so the prefixes the trace shares are shared
//     token for token by the prompts.
//   - Target sends one streamed /v1/completions request with a token-id
//     prompt and max_tokens = output_length, ignore_eos, and measures it
//     (Result).
//   - Run is an open-loop scheduler: request i is sent at its timestamp
//     divided by Config.Speedup, whether or not earlier ones finished,
//     with at most Config.MaxInFlight outstanding; it gathers the Results
//     into a Report.
//
// Time comes from a Clock, so the scheduler and the latency arithmetic
// are tested in virtual time. The simulated replay (replay/simulate,
// `--simulate`) runs its own discrete-event schedule in virtual time and
// summarizes its Results with Summarize, into the same Report.
//
// Run and Target are safe for concurrent use; a Report is the caller's.
package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/trace"
)

// Clock is where the replay reads time and waits. RealClock is the wall
// clock; tests use a virtual one.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t or later, or with ctx's error if ctx ends
	// first.
	SleepUntil(ctx context.Context, t time.Time) error
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Config is how Run schedules requests.
type Config struct {
	// Speedup divides every timestamp: 10 replays the trace ten times
	// faster. Must be > 0; the default (0) is 1.
	Speedup float64
	// MaxInFlight caps the requests outstanding at once; a request whose
	// time has come waits for a slot, and is counted in Report.Waited.
	// The default (0) is 1024.
	MaxInFlight int
	// Clock is the time source; nil is RealClock.
	Clock Clock
	// Progress, if set, is called after each request ends with the number
	// ended so far and the total; from several goroutines, never at once.
	Progress func(done, total int)
}

// DefaultMaxInFlight is Config.MaxInFlight's default.
const DefaultMaxInFlight = 1024

// ErrConfig marks a bad Config; test with errors.Is.
var ErrConfig = errors.New("replay: bad config")

// EnsureDefaults sets the zero fields to their defaults.
func (c *Config) EnsureDefaults() {
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Clock == nil {
		c.Clock = RealClock{}
	}
}

// Validate reports every bad field at once, as an error matching ErrConfig.
func (c *Config) Validate() error {
	var errs []error
	if !(c.Speedup > 0) || c.Speedup > 1e9 {
		errs = append(errs, fmt.Errorf("speedup is %v, must be > 0", c.Speedup))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max in flight is %d, must be ≥ 1", c.MaxInFlight))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// Offset is when request r is sent, after the replay's start.
func (c *Config) Offset(r trace.Request) time.Duration {
	return time.Duration(float64(r.Timestamp) * float64(time.Millisecond) / c.Speedup)
}

// SendFunc sends request i of the trace and measures it.
type SendFunc func(ctx context.Context, i int, r trace.Request) Result

// Run replays reqs in file order, request i at start + Offset(reqs[i]),
// and returns what they measured. If ctx ends, requests not sent yet are
// not sent, those in flight are given ctx, and Run returns the report so
// far with ctx's error.
func Run(ctx context.Context, reqs []trace.Request, cfg Config, send SendFunc) (*Report, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	results := make([]Result, len(reqs))
	sent := make([]bool, len(reqs))
	slots := make(chan struct{}, cfg.MaxInFlight)
	var wg sync.WaitGroup
	var mu sync.Mutex // serializes Progress
	var done atomic.Int64
	waited := 0
	start := cfg.Clock.Now()
	var stopped error
schedule:
	for i, r := range reqs {
		if err := cfg.Clock.SleepUntil(ctx, start.Add(cfg.Offset(r))); err != nil {
			stopped = err
			break
		}
		select {
		case slots <- struct{}{}:
		default:
			waited++
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				stopped = ctx.Err()
				break schedule
			}
		}
		sent[i] = true
		wg.Go(func() {
			defer func() { <-slots }()
			results[i] = send(ctx, i, r)
			n := int(done.Add(1))
			if cfg.Progress != nil {
				mu.Lock()
				cfg.Progress(n, len(reqs))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	end := cfg.Clock.Now()
	rep := newReport(reqs, results, sent, end.Sub(start))
	rep.Waited = waited
	rep.Speedup = cfg.Speedup
	rep.MaxInFlight = cfg.MaxInFlight
	return rep, stopped
}

// Package lifecycle runs the parts of a process — a cache node today;
// workers, a frontend and a planner beside it in one process tomorrow —
// as one: it starts them in order and, when one fails to start, stops
// those already started, in reverse; it runs them until the process is
// asked to stop or one of them fails on its own; then it stops them all in
// reverse order, within one deadline.
//
// A Runner's Ready is safe for concurrent use; Run is called once.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// A Part is one thing a process runs.
type Part interface {
	// Name names the part in logs and errors.
	Name() string
	// Start brings the part up; once it returns nil the part serves. A
	// Start that fails leaves nothing of the part running.
	Start(ctx context.Context) error
	// Failed yields an error if the part stops serving on its own.
	Failed() <-chan error
	// Stop shuts a started part down, cutting whatever is still in flight
	// when ctx's deadline comes.
	Stop(ctx context.Context) error
}

// A Checker is a Part that says whether it is ready to serve (nil) or why
// not; a part that is no Checker is ready once started.
type Checker interface {
	Ready() error
}

// A Reloader is a Part that reads its files again (certificates, users)
// when the process is told to (SIGHUP); it keeps what it had when that
// fails, and says so in the error.
type Reloader interface {
	Reload() error
}

// Config configures a Runner.
type Config struct {
	// ShutdownTimeout bounds the stop of all parts together. The default
	// is 30 seconds.
	ShutdownTimeout time.Duration
	// Logger receives a line when the process starts shutting down, and
	// why, and when it has stopped. The default is slog.Default().
	Logger *slog.Logger
	// Reload, when set, delivers the process's reload signals (SIGHUP):
	// on each, while the parts run, Run calls Reload of every part that
	// is a Reloader, in order. Default nil: no reloads.
	Reload <-chan os.Signal
}

// DefaultShutdownTimeout is Config.ShutdownTimeout's default.
const DefaultShutdownTimeout = 30 * time.Second

// EnsureDefaults sets c's zero fields to their defaults.
func (c *Config) EnsureDefaults() {
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports what is wrong with c. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("lifecycle: ShutdownTimeout %v is negative", c.ShutdownTimeout)
	}
	return nil
}

// ErrNotRunning is what Ready says before every part has started and once
// the parts are stopping.
var ErrNotRunning = errors.New("lifecycle: starting or stopping")

// Runner runs parts.
type Runner struct {
	cfg   Config
	parts []Part

	mu      sync.Mutex
	running bool // every part started, none stopping
}

// New returns a Runner of parts, which start in the order given.
func New(cfg Config, parts ...Part) (*Runner, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Runner{cfg: cfg, parts: parts}, nil
}

// Run starts the parts, runs them until ctx is done or one fails, then
// stops them. It returns the error of a failed start (after stopping the
// parts started before it), or the failure that ended the run joined with
// the errors of the stops; nil after a stop asked for by ctx that went
// well.
func (r *Runner) Run(ctx context.Context) error {
	for i, p := range r.parts {
		if err := p.Start(ctx); err != nil {
			if stopErr := r.stop(r.parts[:i]); stopErr != nil {
				return errors.Join(err, stopErr)
			}
			return err
		}
	}
	r.setRunning(true)

	failed := make(chan error, 1)
	quit := make(chan struct{})
	for _, p := range r.parts {
		go func() {
			select {
			case err := <-p.Failed():
				select {
				case failed <- fmt.Errorf("%s: %w", p.Name(), err):
				default: // another failed first
				}
			case <-quit:
			}
		}()
	}
	var runErr error
wait:
	for {
		select {
		case <-ctx.Done():
			r.cfg.Logger.Info("shutting down", "timeout", r.cfg.ShutdownTimeout)
			break wait
		case runErr = <-failed:
			r.cfg.Logger.Error("a server failed; shutting down", "err", runErr)
			break wait
		case <-r.cfg.Reload:
			r.reload()
		}
	}
	close(quit)
	r.setRunning(false)
	stopErr := r.stop(r.parts)
	if stopErr == nil {
		r.cfg.Logger.Info("stopped")
	}
	return errors.Join(runErr, stopErr)
}

// reload calls Reload of every part that has one; a failure is the
// part's to log, and changes nothing else.
func (r *Runner) reload() {
	for _, p := range r.parts {
		if rl, ok := p.(Reloader); ok {
			if err := rl.Reload(); err != nil {
				r.cfg.Logger.Debug("reload failed", "part", p.Name(), "err", err)
			}
		}
	}
}

// stop stops parts in reverse order, all within one ShutdownTimeout.
func (r *Runner) stop(parts []Part) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	for i := len(parts) - 1; i >= 0; i-- {
		if err := parts[i].Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop: %w", parts[i].Name(), err))
		}
	}
	return errors.Join(errs...)
}

func (r *Runner) setRunning(v bool) {
	r.mu.Lock()
	r.running = v
	r.mu.Unlock()
}

// Ready reports whether every part is started and ready: nil, or what is
// not, naming each part that is not ready.
func (r *Runner) Ready() error {
	r.mu.Lock()
	running := r.running
	r.mu.Unlock()
	if !running {
		return ErrNotRunning
	}
	var errs []error
	for _, p := range r.parts {
		if c, ok := p.(Checker); ok {
			if err := c.Ready(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

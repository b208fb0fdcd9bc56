//go:build ucx

package ucx

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A listener's worker serves many connections, each on its own goroutine
// (Handler calls may block), so one background loop drives it: sessions
// hand it ops to start and functions to run (post, do, call), and it
// progresses UCX, turns completions into done ops and wakes their owners.
// It polls for BusyPoll after its last activity (a completion, new work);
// then it arms the worker's event fd and sleeps in poll(2) on it and on the
// eventfd post and do signal, so an idle listener costs no CPU.

// loopState is the background loop of a worker.
type loopState struct {
	mu       sync.Mutex
	cmds     []cmd
	spare    []cmd
	stopping bool
	sleeping atomic.Bool
	done     chan struct{}
}

// cmd is a unit of work for the loop: an op to start or a function to run
// with the worker's mutex held.
type cmd struct {
	o  *op
	fn func()
}

// startLoop makes a worker and starts its background loop.
func startLoop(name string, settings [][2]string, busy time.Duration) (*worker, error) {
	w, err := newWorker(name, settings, busy)
	if err != nil {
		return nil, err
	}
	w.loop = &loopState{done: make(chan struct{})}
	go w.runLoop()
	return w, nil
}

// post hands ops to the loop to start, in order.
func (w *worker) post(ops ...*op) error {
	l := w.loop
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return errStopped
	}
	for _, o := range ops {
		l.cmds = append(l.cmds, cmd{o: o})
	}
	if l.sleeping.Load() {
		w.signal()
	}
	return nil
}

// do runs fn on the loop, with the worker's mutex held, after the work
// handed in before it.
func (w *worker) do(fn func()) error {
	l := w.loop
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopping {
		return errStopped
	}
	l.cmds = append(l.cmds, cmd{fn: fn})
	if l.sleeping.Load() {
		w.signal()
	}
	return nil
}

// call runs fn on the loop and waits for it.
func (w *worker) call(fn func()) error {
	ran := make(chan struct{})
	if err := w.do(func() { fn(); close(ran) }); err != nil {
		return err
	}
	<-ran
	return nil
}

// stop ends the loop once every outstanding op completed (or abortTimeout
// passed) and destroys the worker, which finishes whatever is left; it
// waits for that. Work handed in afterwards is refused with errStopped.
func (w *worker) stop() {
	l := w.loop
	l.mu.Lock()
	l.stopping = true
	l.mu.Unlock()
	w.signal()
	<-l.done
}

func (w *worker) runLoop() {
	l := w.loop
	defer close(l.done)
	last := time.Now()
	var stopBy time.Time
	for woke := true; ; {
		l.mu.Lock()
		run := l.cmds
		l.cmds, l.spare = l.spare[:0], nil
		stopping := l.stopping
		l.mu.Unlock()

		w.mu.Lock()
		active := len(run) > 0
		for i, c := range run {
			if c.o != nil {
				w.startLocked(c.o)
			} else {
				c.fn()
			}
			run[i] = cmd{}
		}
		if w.progressLocked() {
			active = true
		} else if woke && w.probe != nil {
			w.probe()
			w.dispatchLocked()
		}
		outstanding := len(w.ops)
		w.mu.Unlock()

		l.mu.Lock()
		l.spare = run[:0]
		l.mu.Unlock()

		woke = false
		now := time.Now()
		if stopping {
			if outstanding == 0 {
				break
			}
			if stopBy.IsZero() {
				stopBy = now.Add(abortTimeout)
			} else if now.After(stopBy) {
				break
			}
		}
		if active {
			last = now
			continue
		}
		if now.Sub(last) < w.busy {
			// Poll on, but let other goroutines (the sessions this loop
			// serves) have the processor: with few cores a spinning loop
			// would otherwise hold off the very goroutine it waits for.
			runtime.Gosched()
			continue
		}
		l.sleeping.Store(true)
		l.mu.Lock()
		pending := len(l.cmds) > 0 || l.stopping != stopping
		l.mu.Unlock()
		if !pending {
			timeout := -1
			if outstanding > 0 || stopping {
				timeout = int(idleWake / time.Millisecond)
			}
			w.sleep(timeout)
			woke = true
		}
		l.sleeping.Store(false)
	}
	w.mu.Lock()
	w.destroyLocked()
	w.mu.Unlock()
}

// A connection's worker has one user, the connection's request in flight,
// so that request's goroutine drives it itself: it posts its ops straight
// to UCX, and while it waits it progresses the worker, checksums what
// arrived, and posts what comes next, all on one thread. While UCX has
// nothing for it, it polls for BusyPoll, then arms the worker's event fd
// and sleeps on it; a ctx that ends, a Close or the node's socket closing
// signal the worker's eventfd to wake it.

// startInline makes a worker for a connection to drive inline.
func startInline(name string, settings [][2]string, busy time.Duration) (*worker, error) {
	return newWorker(name, settings, busy)
}

// postNow starts ops at once.
func (w *worker) postNow(ops ...*op) {
	w.mu.Lock()
	for _, o := range ops {
		w.startLocked(o)
	}
	w.mu.Unlock()
}

// drive progresses the worker until done reports true, or until stop
// returns an error (checked between rounds), which drive returns.
func (w *worker) drive(done func() bool, stop func() error) error {
	last := time.Now()
	for {
		w.mu.Lock()
		active := w.c != nil && w.progressLocked()
		w.mu.Unlock()
		if done() {
			return nil
		}
		if err := stop(); err != nil {
			return err
		}
		now := time.Now()
		if active {
			last = now
			continue
		}
		if now.Sub(last) < w.busy {
			runtime.Gosched() // see runLoop
			continue
		}
		w.sleep(int(idleWake / time.Millisecond))
	}
}

// destroy destroys an inline worker.
func (w *worker) destroy() {
	w.mu.Lock()
	w.destroyLocked()
	w.mu.Unlock()
}

//go:build ucx

package ucx

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// abortTimeout bounds how long an owner waits for UCX to complete the
// operations it cancelled or whose endpoint it force-closed. UCX completes
// them at once, with one exception in UCX 1.13: after a peer vanished in
// the middle of two or more rendezvous sends on one shared-memory
// endpoint, force-closing it leaves the others pending for good. Then only
// destroying the worker ends them: a client destroys its own at once; a
// listener parks the buffers of such sends until its worker is destroyed
// (listener.orphan).
const abortTimeout = time.Second

// idleWake bounds a worker's sleep while operations are outstanding, as a
// safety net under the event file descriptor.
const idleWake = 100 * time.Millisecond

// errStopped answers work handed to a worker that is shutting down.
var errStopped = errors.New("ucx: worker stopped")

type opKind uint8

const (
	opSend opKind = iota
	opRecv
	opMsgRecv
	opClose // force-close an endpoint
	opFlush // complete, remotely, everything sent on an endpoint
)

// op is one UCX operation. Its owner fills the request fields and hands it
// to the worker; from then until done is true only the worker touches it.
// Buffers are pinned (runtime.Pinner) right before UCX sees them and
// unpinned when UCX reports the op complete or the worker is destroyed, so
// that UCX never holds the address of Go memory the collector may free or
// move (the cgo rule for C keeping a Go pointer past a call).
type op struct {
	kind      opKind
	ep        epHandle
	buf       []byte
	dev       uint64 // opSend, opRecv: a CUDA device address used in place of buf when not 0
	devLen    int    // the bytes at dev
	tag, mask uint64
	msg       unsafe.Pointer // opMsgRecv: the probed message
	wk        waker          // woken when done; nil for none

	// the worker's, under its mutex
	id  uint64
	req unsafe.Pointer
	pin runtime.Pinner

	done atomic.Bool
	st   ucsStatus // results, valid once done
	n    int
	stag uint64
}

// err returns the op's failure, nil if it succeeded.
func (o *op) err() error { return o.st.err() }

// waker wakes one owner goroutine; a wake while it is awake is kept.
type waker chan struct{}

func newWaker() waker { return make(waker, 1) }

func (k waker) wake() {
	select {
	case k <- struct{}{}:
	default:
	}
}

// epState is what a worker knows of an endpoint it opened.
type epState struct {
	ep      epHandle
	onErr   func(ucsStatus) // called when UCX fails the endpoint
	closing bool
}

// worker is one UCP context with one worker. Its mutex serializes every UCP
// call on it (UCS_THREAD_MODE_SERIALIZED); completions come back as events
// that dispatch turns into done ops. Two drivers progress it: a listener's
// background loop (progress.go), and a connection's own goroutine, which
// drives it inline while it waits (progress.go), so that a client moves its
// bytes on one thread, as ucx_perftest does.
type worker struct {
	name string
	busy time.Duration
	addr []byte // the worker's UCX address
	// cuda: the UCX in use moves CUDA device memory itself; else blocks in
	// GPU memory are staged through host memory.
	cuda bool

	sigMu sync.Mutex
	wake  int // eventfd that wakes a sleeping driver; -1 once closed

	fds   [2]unix.PollFd // the driver's, for poll(2)
	drain [8]byte

	mu     sync.Mutex
	c      *cworker // nil once destroyed
	ops    map[uint64]*op
	eps    map[uint64]*epState
	nextID uint64
	events []event
	// probe, when set, runs after every progress that did something: the
	// listener's hook that takes requests off the unexpected queue.
	probe func()

	loop *loopState // the background loop, for a listener's worker
}

// openWorker makes a context and worker configured with settings.
func newWorker(name string, settings [][2]string, busy time.Duration) (*worker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	c, err := openWorker(settings)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	addr, err := workerAddress(c)
	if err != nil {
		closeWorker(c)
		_ = unix.Close(fd)
		return nil, err
	}
	return &worker{name: name, busy: busy, addr: addr, wake: fd, c: c, cuda: deviceMemory(c),
		ops: make(map[uint64]*op), eps: make(map[uint64]*epState)}, nil
}

// eventOne is what signal writes to an eventfd.
var eventOne = [8]byte{1}

// signal wakes the worker's driver if it sleeps (or makes its next sleep
// return at once).
func (w *worker) signal() {
	w.sigMu.Lock()
	if w.wake >= 0 {
		_, _ = unix.Write(w.wake, eventOne[:])
	}
	w.sigMu.Unlock()
}

// sleep arms the worker and waits until UCX has an event for it, the
// eventfd is signalled, or timeout (milliseconds, -1 for none) passes. w.mu
// must not be held.
func (w *worker) sleep(timeout int) {
	w.mu.Lock()
	st := ucsBusy
	if w.c != nil {
		st = arm(w.c)
	}
	efd := -1
	if w.c != nil {
		efd = workerFD(w.c)
	}
	w.mu.Unlock()
	if st == ucsBusy {
		return
	}
	w.sigMu.Lock()
	wake := w.wake
	w.sigMu.Unlock()
	if wake < 0 {
		return
	}
	w.fds = [2]unix.PollFd{{Fd: int32(efd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
	_, _ = unix.Poll(w.fds[:], timeout)
	_, _ = unix.Read(wake, w.drain[:])
}

// progressLocked progresses UCX and dispatches what completed; it reports
// whether anything happened.
func (w *worker) progressLocked() bool {
	active := progress(w.c) > 0
	if w.dispatchLocked() {
		active = true
	}
	if w.probe != nil && active {
		w.probe()
		w.dispatchLocked()
	}
	return active
}

// startLocked posts o to UCX. An op UCX completes at once is done on
// return.
func (w *worker) startLocked(o *op) {
	if w.c == nil {
		w.finishLocked(o, ucsCanceled, 0, 0)
		return
	}
	if need := len(w.ops) + len(w.eps) + 16; need > eventCap(w.c) && !reserveEvents(w.c, 2*need) {
		w.finishLocked(o, ucsNoMemory, 0, 0)
		return
	}
	if len(o.buf) > 0 {
		o.pin.Pin(&o.buf[0])
	}
	w.nextID++
	o.id = w.nextID
	var st ucsStatus
	n := 0
	switch o.kind {
	case opSend:
		if o.dev != 0 {
			o.req, st = postSendDev(w.c, o.ep, o.dev, o.devLen, o.tag, o.id)
			n = o.devLen
			break
		}
		o.req, st = postSend(w.c, o.ep, o.buf, o.tag, o.id)
		n = len(o.buf)
	case opRecv:
		if o.dev != 0 {
			o.req, st = postRecvDev(w.c, o.dev, o.devLen, o.tag, o.mask, o.id)
			break
		}
		o.req, st = postRecv(w.c, o.buf, o.tag, o.mask, o.id)
	case opMsgRecv:
		o.req, st = postMsgRecv(w.c, o.buf, o.msg, o.id)
	case opClose:
		if s := w.eps[epKey(o.ep)]; s != nil {
			s.closing = true
		}
		o.req, st = closeEP(w.c, o.ep, o.id)
	case opFlush:
		o.req, st = flushEP(w.c, o.ep, o.id)
	}
	if st == ucsInProgress {
		w.ops[o.id] = o
		return
	}
	w.finishLocked(o, st, n, 0)
}

// dispatchLocked turns the completions UCX recorded into done ops.
func (w *worker) dispatchLocked() bool {
	w.events = takeEvents(w.c, w.events[:0])
	for i := range w.events {
		id, st, n, tag := eventFields(&w.events[i])
		if id == 0 {
			if s := w.eps[tag]; s != nil && !s.closing && s.onErr != nil {
				s.onErr(st)
			}
			continue
		}
		o := w.ops[id]
		if o == nil {
			continue
		}
		delete(w.ops, id)
		freeRequest(o.req)
		o.req = nil
		if o.kind == opSend {
			n = len(o.buf)
			if o.dev != 0 {
				n = o.devLen
			}
		}
		w.finishLocked(o, st, n, tag)
	}
	return len(w.events) > 0
}

func (w *worker) finishLocked(o *op, st ucsStatus, n int, stag uint64) {
	o.pin.Unpin()
	if o.kind == opClose {
		delete(w.eps, epKey(o.ep))
	}
	o.st, o.n, o.stag = st, n, stag
	wk := o.wk
	o.done.Store(true) // from here on the owner may reuse o
	if wk != nil {
		wk.wake()
	}
}

// openEPLocked connects an endpoint to the worker at addr.
func (w *worker) openEPLocked(addr []byte, onErr func(ucsStatus)) (epHandle, error) {
	if w.c == nil {
		return nil, errStopped
	}
	ep, err := createEP(w.c, addr)
	if err == nil {
		w.eps[epKey(ep)] = &epState{ep: ep, onErr: onErr}
	}
	return ep, err
}

// cancelRecvsLocked cancels the receives among ops that UCX has not
// completed; UCX completes them with UCS_ERR_CANCELED. Sends cannot be
// cancelled: force-closing their endpoint completes them.
func (w *worker) cancelRecvsLocked(ops []*op) {
	for _, o := range ops {
		if o.req != nil && !o.done.Load() && (o.kind == opRecv || o.kind == opMsgRecv) {
			cancel(w.c, o.req)
		}
	}
}

// drainStaleLocked takes the unexpected messages of a finished connection
// off the queue and drops them, so that neither their bytes nor the
// senders' rendezvous requests stay behind.
func (w *worker) drainStaleLocked(id uint32) []*op {
	var drops []*op
	for w.c != nil {
		msg, _, _ := probe(w.c, uint64(id)<<idShift, idMask)
		if msg == nil {
			break
		}
		o := &op{kind: opMsgRecv, msg: msg}
		drops = append(drops, o)
		w.startLocked(o)
	}
	return drops
}

// epInfoLocked returns what UCX says of an open endpoint, "" for another.
func (w *worker) epInfoLocked(ep epHandle) string {
	if s := w.eps[epKey(ep)]; s == nil || s.closing || w.c == nil {
		return ""
	}
	return epInfo(ep)
}

// destroyLocked force-closes the endpoints left open, destroys the worker
// and its context, and finishes every op UCX had not completed: with the
// worker gone UCX can touch none of their buffers (their requests went
// with it).
func (w *worker) destroyLocked() {
	if w.c == nil {
		return
	}
	for _, s := range w.eps {
		if !s.closing {
			w.startLocked(&op{kind: opClose, ep: s.ep})
		}
	}
	closeWorker(w.c)
	w.c = nil
	for id, o := range w.ops {
		delete(w.ops, id)
		o.req = nil
		w.finishLocked(o, ucsCanceled, 0, 0)
	}
	w.sigMu.Lock()
	_ = unix.Close(w.wake)
	w.wake = -1
	w.sigMu.Unlock()
}

// waitAll waits until every op is done, at most until deadline, waking on
// wk; it reports whether they all are.
func waitAll(wk waker, ops []*op, deadline time.Time) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for _, o := range ops {
		for !o.done.Load() {
			d := time.Until(deadline)
			if d <= 0 {
				return false
			}
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			select {
			case <-wk:
			case <-timer.C:
			}
		}
	}
	return true
}

func allDone(ops []*op) bool {
	for _, o := range ops {
		if !o.done.Load() {
			return false
		}
	}
	return true
}

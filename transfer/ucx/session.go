//go:build ucx

package ucx

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

var (
	errGone     = errors.New("the connection is over")
	errIdle     = errors.New("the peer was idle too long")
	errDraining = errors.New("the listener is shutting down")
)

// session serves the requests of one connection, one at a time, on its own
// goroutine: Handler calls (which may block) never run on the worker's
// loop. Every buffer it gives UCX (a block Open pinned, a Reserve, its
// frames) goes back to its owner only after UCX completed the op that used
// it; when the session ends it cancels and force-closes first.
type session struct {
	l    *listener
	opts *Options
	h    transfer.Handler
	nc   net.Conn
	id   uint32
	ep   epHandle
	wk   waker

	gone atomic.Bool

	mu       sync.Mutex
	inbox    []*op // requests taken off the queue by the loop, in order
	ready    bool  // the handshake is done
	draining bool  // end after the request being served (Shutdown)
	drained  bool  // the session's goroutine: it ended for draining, every answer sent

	ops      []*op // posted and not yet settled
	free     []*op
	flights  []*flight      // blocks of a get in flight, oldest first
	spare    []*flight      // reaped, for reuse
	inflight int            // their bytes
	reserved []*reservation // blocks of a put being received
	resp     []byte
	res      []byte
	timer    *time.Timer
	digest   index.Digest
}

// flight is one block of a get on its way: its header and chunk sends and
// the release of the bytes they send.
type flight struct {
	hdr     []byte // the header frame
	ops     []*op
	bytes   int
	release func()
}

func (s *session) newFlight() *flight {
	if n := len(s.spare); n > 0 {
		f := s.spare[n-1]
		s.spare = s.spare[:n-1]
		return f
	}
	return &flight{hdr: make([]byte, 0, frame.HeaderSize+frame.MaxMsg)}
}

// reservation is one block of a put: the buffer Reserve gave and the chunk
// receives that fill it.
type reservation struct {
	i         int
	h         index.Header
	ops       []*op
	commit    func(bool) error
	committed bool
}

// newSession makes the session of a connection just accepted; its
// handshake gives it an id and an endpoint.
func newSession(l *listener, nc net.Conn) *session {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &session{l: l, opts: l.opts, h: l.h, nc: nc, wk: newWaker(), timer: t}
}

// Serve runs the connection (netserve.Conn): the hellos, then the session
// until the peer goes away, breaks the protocol, or the listener closes.
func (s *session) Serve() {
	opened, err := s.l.handshake(s)
	if !opened {
		_ = s.nc.Close()
		return
	}
	s.mu.Lock()
	s.ready = err == nil
	s.mu.Unlock()
	if err != nil {
		s.kill()
	}
	go s.watch()
	s.run()
	s.l.freeID(s.id)
}

// Drain ends the session once the request it serves, if any, is answered
// (netserve.Conn); one still in its handshake is closed now.
func (s *session) Drain() {
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	if ready {
		s.drain()
	} else {
		s.kill()
	}
}

// Cut ends the session now (netserve.Conn).
func (s *session) Cut() { s.kill() }

// kill ends the session from outside: the listener closes, the peer's
// socket or endpoint failed. The session's goroutine notices at its next
// wait, or when the Handler call it is in returns.
func (s *session) kill() {
	s.gone.Store(true)
	s.wk.wake()
	_ = s.nc.Close()
}

// drain ends the session once the request it is serving, if any, is
// answered (the listener's Shutdown); it serves no other.
func (s *session) drain() {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	s.wk.wake()
}

// watch kills the session when the client closes its socket; it sends
// nothing after its hello.
func (s *session) watch() {
	var b [1]byte
	_, _ = s.nc.Read(b[:])
	s.kill()
}

// deliver queues a request the loop is receiving; false refuses a third
// one, from a client that does not wait for its answers (on the loop).
func (s *session) deliver(o *op, stag uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inbox) >= 2 {
		return false
	}
	o.tag = stag
	s.inbox = append(s.inbox, o)
	return true
}

func (s *session) run() {
	defer s.end()
	for {
		o, err := s.nextRequest()
		if err != nil {
			return
		}
		_, k, seq, idx := splitTag(o.tag)
		n := idx + 1
		what := "get"
		if k == kindPut {
			what = "put"
		}
		switch {
		case o.st == ucsOK && o.buf != nil:
			if k == kindGet {
				err = s.get(seq, n, o.buf[:o.n])
			} else {
				err = s.put(seq, n, o.buf[:o.n])
			}
		case (o.st == ucsOK || o.st == ucsTruncated) && n > s.opts.MaxBlocks:
			err = s.refuse(seq, fmt.Sprintf("%s of %d blocks, over the %d-block limit; split it", what, n, s.opts.MaxBlocks))
		case o.st == ucsOK || o.st == ucsTruncated:
			err = s.fatal(seq, fmt.Sprintf("a %s of %d blocks in a %d-byte request", what, n, o.n))
		default:
			err = o.err()
		}
		if err != nil {
			return
		}
	}
}

// nextRequest waits for the next request, at most IdleTimeout; once the
// session drains it ends it instead.
func (s *session) nextRequest() (*op, error) {
	deadline := time.Now().Add(s.opts.IdleTimeout)
	for {
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			s.drained = true
			return nil, errDraining
		}
		var head *op
		if len(s.inbox) > 0 && s.inbox[0].done.Load() {
			head = s.inbox[0]
			s.inbox[0] = nil
			s.inbox = s.inbox[1:]
		}
		s.mu.Unlock()
		if head != nil {
			return head, nil
		}
		if err := s.sleep(deadline); err != nil {
			return nil, err
		}
	}
}

// get answers a Get: for each key in turn it opens the block and sends its
// header and, when it has bytes, its chunks straight from the pinned
// bytes, keeping at most SendWindow bytes in flight.
func (s *session) get(seq uint8, n int, req []byte) error {
	if n > s.opts.MaxBlocks {
		return s.refuse(seq, fmt.Sprintf("get of %d blocks, over the %d-block limit; split it", n, s.opts.MaxBlocks))
	}
	if len(req) != requestSize+n*frame.KeySize || opcode(req[0]) != opGet {
		return s.fatal(seq, fmt.Sprintf("a get of %d blocks in a %d-byte request", n, len(req)))
	}
	if err := s.respond(seq, frame.StatusOK, "", n, nil); err != nil {
		return err
	}
	for i := range n {
		if s.gone.Load() {
			return errGone
		}
		k := frame.DecodeKey(req[requestSize+i*frame.KeySize:])
		h, data, dev, release, err := s.open(k)
		if err == nil && dev == nil && len(data) != int(h.Size) {
			release()
			err = fmt.Errorf("ucx: handler opened %d bytes for %v, a block of %d bytes", len(data), k, h.Size)
		}
		st := frame.StatusOf(err)
		if st != frame.StatusOK {
			h, data, dev, release = index.Header{}, nil, nil, nil
		}
		h.Key = k
		msg := frame.Message(st, err)
		fl := s.newFlight()
		fl.bytes, fl.release = len(data), release
		if dev != nil {
			fl.bytes = int(h.Size)
		}
		f := fl.hdr[:frame.HeaderSize+len(msg)]
		frame.PutHeader(f, &h, st, len(msg))
		copy(f[frame.HeaderSize:], msg)
		fl.ops = append(fl.ops[:0], s.send(f, tagOf(s.id, kindHeader, seq, i, 0)))
		cn, each := chunking(fl.bytes, s.opts.ChunkSize)
		for j := range cn {
			if dev != nil { // straight from device memory: UCX built with CUDA
				o := s.send(nil, tagOf(s.id, kindBlock, seq, i, j))
				o.dev, o.devLen = dev.Ptr+uint64(j*each), min(each, fl.bytes-j*each)
				fl.ops = append(fl.ops, o)
				continue
			}
			fl.ops = append(fl.ops, s.send(chunkOf(data, j, each), tagOf(s.id, kindBlock, seq, i, j)))
		}
		s.flights = append(s.flights, fl)
		s.inflight += fl.bytes
		if err := s.post(fl.ops...); err != nil {
			return err
		}
		if err := s.reap(s.opts.SendWindow); err != nil {
			return err
		}
	}
	if err := s.reap(0); err != nil {
		return err
	}
	return s.settle()
}

// open opens block k for a get. A Handler that hands out blocks in GPU
// memory in place (transfer.SourceOpener) gives such a block as dev: sent
// from there where this UCX moves device memory, else staged into host
// memory by dev.Stage (a pinned bounce buffer) and sent from there.
func (s *session) open(k index.Key) (index.Header, []byte, *transfer.DeviceBlock, func(), error) {
	so, ok := s.h.(transfer.SourceOpener)
	if !ok {
		h, data, release, err := s.h.Open(k)
		return h, data, nil, release, err
	}
	h, data, dev, release, err := so.OpenSource(k)
	if err != nil || dev == nil || s.l.w.cuda {
		return h, data, dev, release, err
	}
	staged, done, err := dev.Stage()
	if err != nil {
		release()
		return index.Header{}, nil, nil, nil, err
	}
	return h, staged, nil, func() { done(); release() }, nil
}

// reap releases the blocks whose sends completed, waiting for the oldest
// while more than window bytes are in flight (window 0: until none is).
func (s *session) reap(window int) error {
	for {
		kept := s.flights[:0]
		var failed error
		for _, f := range s.flights {
			if !f.done() {
				kept = append(kept, f)
				continue
			}
			failed = errors.Join(failed, f.err())
			if f.release != nil {
				f.release()
			}
			s.inflight -= f.bytes
			clear(f.ops)
			f.ops, f.release = f.ops[:0], nil
			s.spare = append(s.spare, f)
		}
		clear(s.flights[len(kept):])
		s.flights = kept
		if failed != nil {
			return failed
		}
		if len(s.flights) == 0 || (s.inflight <= window && window > 0) {
			return nil
		}
		for _, o := range s.flights[0].ops {
			if err := s.wait(o); err != nil {
				return err
			}
		}
	}
}

func (f *flight) done() bool {
	for _, o := range f.ops {
		if !o.done.Load() {
			return false
		}
	}
	return true
}

func (f *flight) err() error {
	for _, o := range f.ops {
		if o.st != ucsOK {
			return o.err()
		}
	}
	return nil
}

// put answers a Put: it checks every block header and refuses the whole
// request if any is out of bounds; else it reserves each block, posts the
// receives of its chunks straight into the reserved buffer, gives the
// client the go-ahead for the blocks it has room for, and commits each
// block whose bytes match its checksum.
func (s *session) put(seq uint8, n int, req []byte) error {
	if n > s.opts.MaxBlocks {
		return s.refuse(seq, fmt.Sprintf("put of %d blocks, over the %d-block limit; split it", n, s.opts.MaxBlocks))
	}
	if len(req) != requestSize+n*frame.HeaderSize || opcode(req[0]) != opPut {
		return s.fatal(seq, fmt.Sprintf("a put of %d blocks in a %d-byte request", n, len(req)))
	}
	hdrs, _, problem := frame.DecodePutHeaders(make([]index.Header, 0, n), req[requestSize:], s.opts.MaxBlockSize)
	if problem != "" {
		return s.refuse(seq, problem)
	}
	accepted := make([]byte, n)
	results := make([]string, n)
	codes := make([]frame.Status, n)
	var recvs []*op
	for i, h := range hdrs {
		buf, commit, err := s.h.Reserve(h)
		if err == nil && len(buf) != int(h.Size) {
			_ = commit(false)
			err = fmt.Errorf("ucx: handler reserved %d bytes for %v, a block of %d bytes", len(buf), h.Key, h.Size)
		}
		if err != nil {
			codes[i], results[i] = frame.ReserveStatus(err), frame.Clip(err.Error())
			continue
		}
		accepted[i] = 1
		r := &reservation{i: i, h: h, commit: commit}
		cn, each := chunking(len(buf), s.opts.ChunkSize)
		for j := range cn {
			r.ops = append(r.ops, s.recv(chunkOf(buf, j, each), tagOf(s.id, kindPayload, seq, i, j)))
		}
		s.reserved = append(s.reserved, r)
		recvs = append(recvs, r.ops...)
	}
	if err := s.post(recvs...); err != nil {
		return err
	}
	if err := s.respond(seq, frame.StatusOK, "", n, accepted); err != nil {
		return err
	}
	for _, r := range s.reserved {
		s.digest.Reset()
		_, each := chunking(int(r.h.Size), s.opts.ChunkSize)
		for j, o := range r.ops {
			if err := s.wait(o); err != nil {
				return err
			}
			if o.st != ucsOK || o.n != min(each, int(r.h.Size)-j*each) {
				return fmt.Errorf("%w: block %d: chunk %d: %d bytes (%v)", frame.ErrProtocol, r.i, j, o.n, o.err())
			}
			_, _ = s.digest.Write(o.buf)
		}
		r.committed = true
		if s.digest.Sum64() != r.h.Sum {
			_ = r.commit(false)
			codes[r.i] = frame.StatusCorrupt
		} else if err := r.commit(true); err != nil {
			codes[r.i], results[r.i] = frame.StatusError, frame.Clip(err.Error())
		}
	}
	clear(s.reserved)
	s.reserved = s.reserved[:0]
	return s.sendResults(seq, codes, results)
}

func (s *session) sendResults(seq uint8, codes []frame.Status, msgs []string) error {
	size := responseSize
	for _, m := range msgs {
		size += frame.ResultSize + len(m)
	}
	out := grow(&s.res, size)
	putResponse(out, frame.StatusOK, 0, len(codes))
	o := responseSize
	for i, st := range codes {
		frame.PutResult(out[o:], st, len(msgs[i]))
		o += frame.ResultSize + copy(out[o+frame.ResultSize:], msgs[i])
	}
	if err := s.post(s.send(out, tagOf(s.id, kindResults, seq, 0, 0))); err != nil {
		return err
	}
	return s.settle()
}

// respond sends a response frame, with extra bytes after its message.
func (s *session) respond(seq uint8, st frame.Status, msg string, count int, extra []byte) error {
	msg = frame.Clip(msg)
	out := grow(&s.resp, responseSize+len(msg)+len(extra))
	putResponse(out, st, len(msg), count)
	copy(out[responseSize:], msg)
	copy(out[responseSize+len(msg):], extra)
	return s.post(s.send(out, tagOf(s.id, kindResponse, seq, 0, 0)))
}

// refuse answers a request refused as a whole; the session goes on.
func (s *session) refuse(seq uint8, msg string) error {
	if err := s.respond(seq, frame.StatusRefused, msg, 0, nil); err != nil {
		return err
	}
	return s.settle()
}

// fatal answers a request that cannot be followed and ends the session.
func (s *session) fatal(seq uint8, msg string) error {
	if err := s.respond(seq, frame.StatusError, fmt.Sprintf("%v: %s", frame.ErrProtocol, msg), 0, nil); err == nil {
		_ = s.settle()
	}
	return frame.ErrProtocol
}

package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
)

// lingerTimeout bounds how long a server reads on, discarding, after it
// answered a request it cannot follow and half-closed the connection, so
// that the peer reads the answer before the connection is reset.
const lingerTimeout = time.Second

// errClosing ends a session after a response that said it would.
var errClosing = errors.New("closing after a fatal response")

// session serves the requests of one connection, one at a time. Its buffers
// live as long as the connection and never outgrow the limits: in holds at
// most MaxBlocks block headers, out at most MaxBlocks results.
type session struct {
	c    net.Conn
	h    transfer.Handler
	opts *Options

	small [requestSize]byte
	in    []byte // a request's keys or block headers
	// ahead holds bytes the read of a request's header took in past it
	// (see read), a slice of aheadBuf.
	ahead    []byte
	aheadBuf [requestSize + frame.KeySize]byte
	hdrs     []index.Header
	results  []result
	out      []byte // a put's response
	scratch  []byte // payload bytes read only to be discarded
	digest   index.Digest
	batch    batch
	nb       net.Buffers // the batch's iov as WriteTo consumes it
	// begin and end bracket each request for the listener's drain: begin
	// reports false when no new request may start, end when the
	// connection should close after the one just answered.
	begin, end func() bool
	// pending bounds the room reserved for blocks still arriving, across
	// the listener's sessions; nil: no bound.
	pending *pendingPuts

	// The request being read, from its header to its response: when it
	// started (unix nanoseconds, moved on by the time the server spent
	// waiting for room) and the bytes read of it since. Another session
	// short of room reads both to choose a connection to cut, and sets cut.
	reqStart atomic.Int64
	reqRead  atomic.Int64
	cut      atomic.Bool
	deadline time.Time // the read deadline last set
}

// result is the outcome of one block of a put.
type result struct {
	st  frame.Status
	msg string
}

func (s *session) run() {
	for {
		if err := s.readRequestHeader(); err != nil {
			return // the peer went away, went silent, or the listener closed
		}
		s.reqStart.Store(time.Now().UnixNano())
		s.reqRead.Store(0)
		if s.begin != nil && !s.begin() {
			return // draining: the request that just came in is not started
		}
		o, count, err := decodeRequest(s.small[:])
		if err != nil {
			s.fatal(err)
			return
		}
		if o == opGet {
			err = s.get(count)
		} else {
			err = s.put(count)
		}
		if err != nil || (s.end != nil && !s.end()) {
			return
		}
	}
}

// get answers a Get: it reads every key, then streams the blocks in order.
func (s *session) get(count uint32) error {
	if int64(count) > int64(s.opts.MaxBlocks) {
		return s.refuse(fmt.Sprintf("get of %d blocks, over the %d-block limit; split it",
			count, s.opts.MaxBlocks), int64(count)*frame.KeySize)
	}
	n := int(count)
	keys := s.input(n * frame.KeySize)
	if err := s.read(keys); err != nil {
		return err
	}
	open := s.h.Open
	if p, ok := s.h.(transfer.Prefetcher); ok {
		all := make([]index.Key, n)
		for i := range all {
			all[i] = frame.DecodeKey(keys[i*frame.KeySize:])
		}
		o := p.Prefetch(all)
		defer o.Close()
		open = o.Open
	}
	b := &s.batch
	b.reset(s.opts.WriteBatch)
	putResponse(b.frame(responseSize), frame.StatusOK, 0, 0, n)
	for i := range n {
		k := frame.DecodeKey(keys[i*frame.KeySize:])
		h, data, release, err := open(k)
		if err == nil && len(data) != int(h.Size) {
			release()
			err = fmt.Errorf("tcp: handler opened %d bytes for %v, a block of %d bytes", len(data), k, h.Size)
		}
		st := frame.StatusOf(err)
		if st != frame.StatusOK {
			h, data, release = index.Header{}, nil, nil
		}
		h.Key = k
		msg := frame.Message(st, err)
		f := b.frame(frame.HeaderSize + len(msg))
		frame.PutHeader(f, &h, st, len(msg))
		copy(f[frame.HeaderSize:], msg)
		b.add(data, release)
		if b.full() {
			if err := s.flush(); err != nil {
				return err
			}
		}
	}
	return s.flush()
}

// flush writes the gathered frames and payloads in one writev and releases
// the blocks, whether the write succeeded or not.
func (s *session) flush() error {
	b := &s.batch
	b.cut()
	var err error
	if len(b.iov) > 0 {
		_ = s.c.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
		s.nb = b.iov
		_, err = s.nb.WriteTo(s.c)
	}
	for _, release := range b.releases {
		release()
	}
	b.reset(b.limit)
	return err
}

// put answers a Put: it reads and checks every block header, refuses the
// whole request if any is out of bounds, and only then reads the payloads,
// each straight into the buffer the Handler reserved for it.
func (s *session) put(count uint32) error {
	if int64(count) > int64(s.opts.MaxBlocks) {
		rest, err := s.skipHeaders(count)
		if err != nil {
			return err
		}
		return s.refuse(fmt.Sprintf("put of %d blocks, over the %d-block limit; split it",
			count, s.opts.MaxBlocks), rest)
	}
	n := int(count)
	raw := s.input(n * frame.HeaderSize)
	if err := s.read(raw); err != nil {
		return err
	}
	hdrs, payload, problem := frame.DecodePutHeaders(s.hdrs, raw, s.opts.MaxBlockSize)
	s.hdrs = hdrs
	if problem != "" {
		return s.refuse(problem, payload)
	}
	results := s.results[:0]
	for _, h := range hdrs {
		r, err := s.receive(h)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	s.results = results
	return s.writeResults(results)
}

// receive reads one block of a put into the buffer the Handler reserved and
// commits it if its bytes match its checksum. Only a failure to read from
// the connection is returned as an error.
//
// Room is reserved only once the block's first bytes (up to 64 KiB) have
// arrived, and within the listener's MaxPendingBytes: a peer that
// announces blocks and stalls cannot fill the Handler's memory.
func (s *session) receive(h index.Header) (result, error) {
	scratch := s.scratchBuf()
	first := scratch[:min(int(h.Size), len(scratch))]
	if err := s.read(first); err != nil {
		return result{}, err
	}
	rest := int64(h.Size) - int64(len(first))
	waited := time.Now()
	if s.pending != nil {
		if !s.pending.acquire(s, int64(h.Size), waited.Add(s.opts.RequestTimeout)) {
			s.waited(waited)
			if err := s.discard(rest); err != nil {
				return result{}, err
			}
			return result{frame.StatusFull, frame.Clip(fmt.Sprintf(
				"node busy: puts in flight hold its limit of %d bytes; retry", s.opts.MaxPendingBytes))}, nil
		}
		defer s.pending.release(s)
	}
	buf, commit, err := s.h.Reserve(h)
	s.waited(waited)
	if err == nil && len(buf) != int(h.Size) {
		_ = commit(false)
		err = fmt.Errorf("tcp: handler reserved %d bytes for %v, a block of %d bytes", len(buf), h.Key, h.Size)
	}
	if err != nil {
		if err := s.discard(rest); err != nil {
			return result{}, err
		}
		return result{frame.ReserveStatus(err), frame.Clip(err.Error())}, nil
	}
	// The block is hashed as it arrives, each piece while it is still in
	// the CPU's cache: a second pass over a 4 MiB block would read it
	// back from memory.
	s.digest.Reset()
	index.CopySum(&s.digest, buf, first)
	if err := s.readSummed(buf[len(first):]); err != nil {
		_ = commit(false)
		return result{}, err
	}
	if s.digest.Sum64() != h.Sum {
		_ = commit(false)
		return result{frame.StatusCorrupt, ""}, nil
	}
	if err := commit(true); err != nil {
		return result{frame.StatusError, frame.Clip(err.Error())}, nil
	}
	return result{}, nil
}

func (s *session) writeResults(results []result) error {
	size := responseSize
	for _, r := range results {
		size += frame.ResultSize + len(r.msg)
	}
	out := grow(&s.out, size)
	putResponse(out, frame.StatusOK, 0, 0, len(results))
	o := responseSize
	for i, r := range results {
		frame.PutResult(out[o:], r.st, len(r.msg))
		o += frame.ResultSize + copy(out[o+frame.ResultSize:], r.msg)
		results[i].msg = ""
	}
	return s.write(out)
}

// skipHeaders reads the block headers of a put over the count limit in
// MaxBlocks-sized chunks, without keeping them, and returns the payload
// bytes they declare, or -1 when the headers alone pass the most a valid
// request holds (they are not read then).
func (s *session) skipHeaders(count uint32) (int64, error) {
	if int64(count)*frame.HeaderSize > s.maxRequest() {
		return -1, nil
	}
	var payload int64
	for left := int(count); left > 0; {
		n := min(left, s.opts.MaxBlocks)
		raw := s.input(n * frame.HeaderSize)
		if err := s.read(raw); err != nil {
			return 0, err
		}
		for i := range n {
			h, _, _, _ := frame.DecodeHeader(raw[i*frame.HeaderSize:])
			payload += int64(h.Size)
		}
		left -= n
	}
	return payload, nil
}

// refuse answers a request refused as a whole, then reads and discards the
// rest bytes of it still on the way, so that the next request can follow. A
// request that declares more than a valid request could hold (rest over
// maxRequest, or -1) is not read on: the answer says so and the connection
// is closed.
func (s *session) refuse(msg string, rest int64) error {
	msg = frame.Clip(msg)
	closing := rest < 0 || rest > s.maxRequest()
	var flags uint8
	if closing {
		flags = flagClosing
	}
	out := grow(&s.out, responseSize+len(msg))
	putResponse(out, frame.StatusRefused, flags, len(msg), 0)
	copy(out[responseSize:], msg)
	if err := s.write(out); err != nil {
		return err
	}
	if closing {
		s.linger()
		return errClosing
	}
	return s.discard(rest)
}

// fatal answers a request that cannot be framed and ends the session.
func (s *session) fatal(err error) {
	msg := frame.Clip(err.Error())
	out := grow(&s.out, responseSize+len(msg))
	putResponse(out, frame.StatusError, flagClosing, len(msg), 0)
	copy(out[responseSize:], msg)
	if s.write(out) == nil {
		s.linger()
	}
}

// linger half-closes the connection and reads on until the peer stops
// sending, for at most lingerTimeout.
func (s *session) linger() {
	if tc, ok := s.c.(interface{ CloseWrite() error }); ok { // TCP or TLS
		_ = tc.CloseWrite()
	}
	_ = s.c.SetReadDeadline(time.Now().Add(lingerTimeout))
	buf := s.scratchBuf()
	for {
		if _, err := s.c.Read(buf); err != nil {
			return
		}
	}
}

// maxRequest is the most bytes past its 8-byte header a valid request holds.
func (s *session) maxRequest() int64 {
	return int64(s.opts.MaxBlocks) * (frame.HeaderSize + int64(s.opts.MaxBlockSize))
}

// readRequestHeader reads the next request's header into s.small,
// waiting at most IdleTimeout. It asks for the 16 bytes after the header
// too, which every request of a block or more begins with (a Get's first
// key, a Put's first block header), so that a Get of one block comes in
// with one read; it waits for none of them, and read takes them first.
func (s *session) readRequestHeader() error {
	n := copy(s.small[:], s.ahead)
	s.ahead = s.ahead[n:]
	if n == requestSize {
		return nil
	}
	s.setReadDeadline(time.Now().Add(s.opts.IdleTimeout))
	need := requestSize - n
	buf := s.aheadBuf[:need+frame.KeySize]
	m, err := io.ReadAtLeast(s.c, buf, need)
	if err != nil {
		return err
	}
	copy(s.small[n:], buf)
	s.ahead = buf[need:m]
	return nil
}

// read fills b, within a request, from the bytes read ahead and then from
// the connection, until the request's deadline: RequestTimeout after it
// started plus a second for every MinRate bytes of it read, so that a peer
// trickling bytes cannot hold the connection.
func (s *session) read(b []byte) error {
	n := copy(b, s.ahead)
	s.ahead, b = s.ahead[n:], b[n:]
	for len(b) > 0 {
		got := s.reqRead.Load()
		allowance := s.opts.RequestTimeout + time.Duration(float64(got)/float64(s.opts.MinRate)*float64(time.Second))
		s.setReadDeadline(time.Unix(0, s.reqStart.Load()).Add(allowance))
		n, err := s.c.Read(b)
		s.reqRead.Store(got + int64(n))
		b = b[n:]
		if err != nil && len(b) > 0 {
			return err
		}
	}
	return nil
}

// summedRead is the most readSummed reads before it hashes what it read.
const summedRead = 128 << 10

// readSummed fills b from the connection, as read does, and writes its
// bytes to s.digest piece by piece as they arrive.
func (s *session) readSummed(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), summedRead)
		if err := s.read(b[:n]); err != nil {
			return err
		}
		_, _ = s.digest.Write(b[:n])
		b = b[n:]
	}
	return nil
}

func (s *session) setReadDeadline(t time.Time) {
	if !t.Equal(s.deadline) {
		s.deadline = t
		_ = s.c.SetReadDeadline(t)
	}
}

// waited moves the request's start on by the time since t, which the
// server spent, not the peer.
func (s *session) waited(t time.Time) {
	s.reqStart.Add(int64(time.Since(t)))
}

func (s *session) write(b []byte) error {
	_ = s.c.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
	_, err := s.c.Write(b)
	return err
}

// discard reads n bytes and drops them.
func (s *session) discard(n int64) error {
	buf := s.scratchBuf()
	for n > 0 {
		m := int(min(n, int64(len(buf))))
		if err := s.read(buf[:m]); err != nil {
			return err
		}
		n -= int64(m)
	}
	return nil
}

func (s *session) scratchBuf() []byte {
	if s.scratch == nil {
		s.scratch = make([]byte, 64<<10)
	}
	return s.scratch
}

// input returns s.in resized to n bytes; callers bound n by the limits.
func (s *session) input(n int) []byte { return grow(&s.in, n) }

// grow returns (*b)[:n], reallocating *b when it is shorter.
func grow(b *[]byte, n int) []byte {
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	*b = (*b)[:n]
	return *b
}

// batch gathers the frames and payloads of consecutive blocks of a Get for
// one writev. Frames are encoded into one fixed buffer; each run of frames
// between two payloads becomes one iovec, each payload another.
type batch struct {
	frames   []byte
	used     int // bytes of frames encoded
	run      int // start of the frames not yet in iov
	iov      net.Buffers
	releases []func()
	blocks   int
	bytes    int
	limit    int // WriteBatch
}

func (b *batch) reset(limit int) {
	if b.frames == nil {
		b.frames = make([]byte, responseSize+maxBatchBlocks*(frame.HeaderSize+frame.MaxMsg))
	}
	clear(b.iov)
	clear(b.releases)
	b.iov, b.releases = b.iov[:0], b.releases[:0]
	b.used, b.run, b.blocks, b.bytes, b.limit = 0, 0, 0, 0, limit
}

// frame returns the next n bytes of the frame buffer; n is at most
// frame.HeaderSize+frame.MaxMsg, and full keeps that much room.
func (b *batch) frame(n int) []byte {
	f := b.frames[b.used : b.used+n]
	b.used += n
	b.bytes += n
	return f
}

// add appends a block's payload, and the release that unpins it (nil for a
// block sent without one).
func (b *batch) add(data []byte, release func()) {
	b.blocks++
	if release != nil {
		b.releases = append(b.releases, release)
	}
	if len(data) > 0 {
		b.cut()
		b.iov = append(b.iov, data)
		b.bytes += len(data)
	}
}

// cut closes the run of frames encoded since the last payload into an iovec.
func (b *batch) cut() {
	if b.used > b.run {
		b.iov = append(b.iov, b.frames[b.run:b.used])
		b.run = b.used
	}
}

// full says the batch must be written before the next block is added.
func (b *batch) full() bool {
	return b.blocks >= maxBatchBlocks || b.bytes >= b.limit ||
		len(b.frames)-b.used < frame.HeaderSize+frame.MaxMsg
}

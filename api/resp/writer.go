package resp

import (
	"io"
	"net"
	"strconv"
	"sync/atomic"
)

const (
	// directMin is the shortest value written from the store's memory
	// instead of being copied into the reply buffer.
	directMin = 16 << 10
	// maxPendingDirect and maxSegments bound what a writer holds for one
	// flush: the bytes of pinned store values and the number of them.
	maxPendingDirect = 4 << 20
	maxSegments      = 256
)

var crlf = []byte("\r\n")

// writer encodes replies for one connection. Short replies are gathered in
// buf; long values a Store handed out (view) are not copied but queued as
// segments between parts of buf, and flush sends everything with one
// writev (net.Buffers) and then releases the values. Not safe for
// concurrent use.
type writer struct {
	dst   io.Writer
	bw    buffersWriter // dst's own writev, or nil
	limit int           // flush once buf holds this much

	buf      []byte
	segs     []segment
	releases []func()
	direct   int // bytes of queued values
	iov      [][]byte

	err      error          // the first write error; later writes are dropped
	nwritten *atomic.Uint64 // counts the bytes written, if not nil
}

// segment is a value to send after buf[:off].
type segment struct {
	off int
	val []byte
}

// buffersWriter is a destination that writes several buffers with one
// writev of its own (rawSock); others get net.Buffers's.
type buffersWriter interface {
	// WriteBuffers writes every buffer of bufs, in order, and returns the
	// bytes written; it may change the elements of bufs.
	WriteBuffers(bufs [][]byte) (int64, error)
}

func newWriter(dst io.Writer, limit int) *writer {
	bw, _ := dst.(buffersWriter)
	return &writer{dst: dst, bw: bw, limit: limit, buf: make([]byte, 0, limit)}
}

// full reports whether the writer holds enough to flush now rather than
// wait for the input to run dry.
func (w *writer) full() bool {
	return len(w.buf) >= w.limit || w.direct >= maxPendingDirect || len(w.segs) >= maxSegments
}

// flush writes what the writer holds and releases the values it sent.
func (w *writer) flush() error {
	if len(w.buf) == 0 && len(w.segs) == 0 {
		return w.err
	}
	if w.err == nil {
		iov := w.iov[:0]
		prev := 0
		for _, s := range w.segs {
			if s.off > prev {
				iov = append(iov, w.buf[prev:s.off])
			}
			iov = append(iov, s.val)
			prev = s.off
		}
		if prev < len(w.buf) {
			iov = append(iov, w.buf[prev:])
		}
		w.iov = iov
		var n int64
		var err error
		if w.bw != nil {
			n, err = w.bw.WriteBuffers(iov)
		} else {
			bufs := net.Buffers(iov) // WriteTo consumes bufs, not w.iov
			n, err = bufs.WriteTo(w.dst)
		}
		if w.nwritten != nil {
			w.nwritten.Add(uint64(n))
		}
		w.err = err
		clear(w.iov)
	}
	w.discard()
	return w.err
}

// discard drops what the writer holds and releases the values.
func (w *writer) discard() {
	for i, rel := range w.releases {
		rel()
		w.releases[i] = nil
	}
	clear(w.segs)
	w.buf, w.segs, w.releases, w.direct = w.buf[:0], w.segs[:0], w.releases[:0], 0
}

func (w *writer) simple(s string) {
	w.buf = append(w.buf, '+')
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, crlf...)
}

// error writes msg as an error reply; msg starts with its code ("ERR …").
// Line breaks in it, which would end the reply early, become spaces.
func (w *writer) error(msg string) {
	w.buf = append(w.buf, '-')
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		w.buf = append(w.buf, c)
	}
	w.buf = append(w.buf, crlf...)
}

func (w *writer) int(n int64) {
	w.buf = append(w.buf, ':')
	w.buf = strconv.AppendInt(w.buf, n, 10)
	w.buf = append(w.buf, crlf...)
}

func (w *writer) header(kind byte, n int) {
	w.buf = append(w.buf, kind)
	w.buf = strconv.AppendInt(w.buf, int64(n), 10)
	w.buf = append(w.buf, crlf...)
}

func (w *writer) array(n int) { w.header('*', n) }
func (w *writer) null()       { w.buf = append(w.buf, "$-1\r\n"...) }

// bulk writes b as a bulk string, copying it.
func (w *writer) bulk(b []byte) {
	w.header('$', len(b))
	w.buf = append(w.buf, b...)
	w.buf = append(w.buf, crlf...)
}

func (w *writer) bulkString(s string) {
	w.header('$', len(s))
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, crlf...)
}

// view writes a value a Store handed out and calls release (which may be
// nil) once the value is no longer needed: at once for a short value,
// which is copied, or after the flush that sends a long one.
func (w *writer) view(v []byte, release func()) {
	if len(v) < directMin {
		w.bulk(v)
		if release != nil {
			release()
		}
		return
	}
	w.header('$', len(v))
	w.segs = append(w.segs, segment{off: len(w.buf), val: v})
	w.buf = append(w.buf, crlf...)
	w.direct += len(v)
	if release != nil {
		w.releases = append(w.releases, release)
	}
}

func (w *writer) stringArray(ss []string) {
	w.array(len(ss))
	for _, s := range ss {
		w.bulkString(s)
	}
}

package resp

import (
	"context"
	"errors"
	"fmt"
)

// Streamer is an optional power of a Store that keeps large values in
// pieces (several blocks). GET asks it instead of View: a value it returns
// as a stream is written to the client piece by piece, as the store reads
// it, so the server never holds the value whole.
type Streamer interface {
	// ViewStream returns key's value: in one piece, as View does, or, for
	// a value the store keeps in pieces, as a stream. A missing key is an
	// error matching ErrNotFound.
	ViewStream(ctx context.Context, key string) (StreamValue, error)
}

// StreamValue is a value ViewStream returned.
type StreamValue struct {
	// Bytes and Release are a value in one piece, as View returns them.
	Bytes   []byte
	Release func()
	// Stream, when set, is a value of Size bytes in pieces: it calls emit
	// with each piece in order, each valid only during the call, stops at
	// emit's first error, and releases what it holds before it returns.
	// An error after the first piece leaves the reply unfinished: the
	// server closes the connection, so that the client never takes part
	// of a value for all of it. The server calls Stream exactly once.
	Size   int64
	Stream func(emit func(piece []byte) error) error
}

// getStreamed is GET from a Streamer.
func (c *conn) getStreamed(st Streamer, key string) {
	v, err := st.ViewStream(c.direct.ctx, key)
	if err != nil {
		if v.Release != nil {
			v.Release()
		}
		c.getFailed(err)
		return
	}
	c.s.st.hits.Add(1)
	if v.Stream == nil {
		c.w.view(v.Bytes, v.Release)
		return
	}
	c.w.stream(v.Size, v.Stream)
}

// getFailed replies to a GET whose value could not be read.
func (c *conn) getFailed(err error) {
	if errors.Is(err, ErrNotFound) {
		c.s.st.misses.Add(1)
		c.w.null()
		return
	}
	c.storeError(err)
}

// stream writes a bulk string of size bytes whose pieces stream emits:
// what the writer holds goes out first, then each piece straight to the
// socket. A stream that fails or comes out short marks the writer failed,
// which closes the connection at its next flush.
func (w *writer) stream(size int64, stream func(emit func([]byte) error) error) {
	w.header('$', int(size))
	if err := w.flush(); err != nil {
		_ = stream(func([]byte) error { return err })
		return
	}
	var sent int64
	err := stream(func(p []byte) error {
		n, err := w.dst.Write(p)
		sent += int64(n)
		if w.nwritten != nil {
			w.nwritten.Add(uint64(n))
		}
		return err
	})
	if err == nil && sent != size {
		err = fmt.Errorf("resp: a value of %d bytes streamed as %d", size, sent)
	}
	if err != nil {
		w.err = err
		return
	}
	w.buf = append(w.buf, crlf...)
}

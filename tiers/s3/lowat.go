package s3

import (
	"context"
	"io"
	"net"
	"net/http/httptrace"
	"syscall"
)

// A ranged GET of a segment brings tens of megabytes over one connection.
// Read as they come, its bytes arrive a loopback packet (64 KiB) or a few
// at a time, and each costs a read syscall and a wakeup of the reading
// goroutine. A receive low-water mark (SO_RCVLOWAT) has the kernel wake the
// reader only once lowatBytes are queued, so that each read takes a large
// piece. The mark is set on a response's connection once its headers are
// in, lowered as the body's end nears so that it never asks for bytes that
// will not come, and put back to one byte before the connection serves
// another request.

// lowatBytes is the low-water mark while a body has more than that left.
const lowatBytes = 1 << 20

// bufferedBytes is how many bytes of a connection the HTTP client may hold
// read ahead in its own buffer (http.Transport's default ReadBufferSize):
// bytes of the body the kernel no longer queues.
const bufferedBytes = 4 << 10

// markConn is a connection of the store's client whose receive low-water
// mark a response's reader can set.
type markConn struct {
	net.Conn
	raw  syscall.RawConn
	mark int // the mark set, 1 (the kernel's default) when none
}

// dialMarked wraps dial so that the TCP connections it makes are
// markConns.
func dialMarked(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil
		}
		raw, err := tc.SyscallConn()
		if err != nil {
			return c, nil
		}
		return &markConn{Conn: c, raw: raw, mark: 1}, nil
	}
}

// setMark sets the connection's receive low-water mark to n bytes, if it
// is not that already. A failure leaves the mark as it was: reads are then
// only smaller.
func (c *markConn) setMark(n int) {
	if n == c.mark {
		return
	}
	var err error
	if cerr := c.raw.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); cerr != nil || err != nil {
		return
	}
	c.mark = n
}

// traceConn returns ctx with a trace that records in *conn the markConn
// its request is sent on, if it is one.
func traceConn(ctx context.Context, conn **markConn) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		c, _ := info.Conn.(*markConn)
		*conn = c
	}})
}

// markedBody reads a response body of left bytes from conn (nil: no mark
// to set) with the connection's low-water mark at lowatBytes until the
// body's last bytes; Close puts the mark back to one byte and closes the
// body.
type markedBody struct {
	body io.ReadCloser
	conn *markConn
	left int64
}

func (b *markedBody) Read(p []byte) (int, error) {
	if b.conn != nil {
		// Every byte the mark asks for is still to come: the body's bytes
		// not read yet, less those the HTTP client may hold in its buffer.
		b.conn.setMark(int(max(1, min(lowatBytes, b.left-bufferedBytes))))
	}
	n, err := b.body.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *markedBody) Close() error {
	if b.conn != nil {
		b.conn.setMark(1)
	}
	return b.body.Close()
}

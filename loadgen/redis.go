package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// ErrRedisProtocol marks a reply that is not the RESP2 the command expects;
// the connection is closed after it.
var ErrRedisProtocol = errors.New("redis: protocol error")

// RedisError is an error reply of the server ("-ERR …"); the connection
// stays usable.
type RedisError struct{ Msg string }

func (e *RedisError) Error() string { return "redis: " + e.Msg }

var crlfBytes = []byte("\r\n")

// aLongTimeAgo is a deadline in the past: setting it fails blocked I/O now.
var aLongTimeAgo = time.Unix(1, 0)

// RedisConn is a minimal RESP2 client on one connection: PING, SET and
// GET, one command at a time, no pipelining. Values go to the socket
// straight from the caller's slice (one writev) and come back straight into
// the caller's buffer.
//
// A RedisConn is not safe for concurrent use. After an I/O or protocol
// error it is closed, and every later call fails.
type RedisConn struct {
	nc      net.Conn
	r       *bufio.Reader
	addr    string
	timeout time.Duration
	broken  error

	hdr []byte // a command up to its last argument's bytes
	iov [3][]byte
	nb  net.Buffers
}

// DialRedis connects to the Redis server at addr (host:port) and checks it
// answers PING. timeout bounds the dial and each later command (besides
// ctx's deadline); 0 means 10 seconds.
func DialRedis(ctx context.Context, addr string, timeout time.Duration) (*RedisConn, error) {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("redis: dial %s: %w", addr, err)
	}
	c := &RedisConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), addr: addr, timeout: timeout}
	if err := c.Ping(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close closes the connection.
func (c *RedisConn) Close() error {
	if c.broken == nil {
		c.broken = errors.New("the connection is closed")
	}
	return c.nc.Close()
}

// Ping sends PING and expects PONG.
func (c *RedisConn) Ping(ctx context.Context) error {
	return c.simple(ctx, "PONG", nil, "PING")
}

// Set stores value under key.
func (c *RedisConn) Set(ctx context.Context, key, value []byte) error {
	return c.simple(ctx, "OK", value, "SET", string(key))
}

// Get reads key's value into buf, growing it when it is too small, and
// returns the value (a prefix of buf or of the grown buffer); found is
// false when the key does not exist.
func (c *RedisConn) Get(ctx context.Context, key, buf []byte) (value []byte, found bool, err error) {
	err = c.do(ctx, nil, func() error {
		n, err := c.bulkLen()
		if err != nil || n < 0 {
			return err
		}
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		value, found = buf[:n], true
		if _, err := io.ReadFull(c.r, value); err != nil {
			return err
		}
		return c.crlf()
	}, "GET", string(key))
	if err != nil {
		return nil, false, err
	}
	return value, found, nil
}

// simple runs a command whose reply is the simple string want.
func (c *RedisConn) simple(ctx context.Context, want string, value []byte, args ...string) error {
	return c.do(ctx, value, func() error {
		line, err := c.line()
		if err != nil {
			return err
		}
		switch {
		case line[0] == '-':
			return &RedisError{Msg: string(line[1:])}
		case line[0] != '+' || string(line[1:]) != want:
			return fmt.Errorf("%w: %q in reply to %s, want +%s", ErrRedisProtocol, line, args[0], want)
		}
		return nil
	}, args...)
}

// do sends the command args (and value as its last argument, if not nil)
// and reads the reply with read, within the connection's timeout and ctx.
func (c *RedisConn) do(ctx context.Context, value []byte, read func() error, args ...string) error {
	if c.broken != nil {
		return fmt.Errorf("redis: %s at %s: %w", args[0], c.addr, c.broken)
	}
	deadline := time.Now().Add(c.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	defer stop()

	n := len(args)
	if value != nil {
		n++
	}
	h := append(c.hdr[:0], '*')
	h = strconv.AppendInt(h, int64(n), 10)
	h = append(h, "\r\n"...)
	for _, a := range args {
		h = appendBulk(h, len(a))
		h = append(h, a...)
		h = append(h, "\r\n"...)
	}
	iov := c.iov[:1]
	if value != nil {
		h = appendBulk(h, len(value))
		iov = append(iov, value, crlfBytes)
	}
	c.hdr, iov[0] = h, h
	c.nb = iov
	_, err := c.nb.WriteTo(c.nc)
	clear(c.iov[:]) // keep no reference to the caller's value
	if err == nil {
		err = read()
	}
	var re *RedisError
	if err == nil || errors.As(err, &re) {
		return err
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	c.broken = err
	c.nc.Close()
	return fmt.Errorf("redis: %s at %s: %w", args[0], c.addr, err)
}

func appendBulk(b []byte, n int) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, "\r\n"...)
}

// line reads one CRLF-terminated line of a reply, without the CRLF; it is
// valid until the next read.
func (c *RedisConn) line() ([]byte, error) {
	b, err := c.r.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("%w: a reply line over %d bytes", ErrRedisProtocol, c.r.Size())
	case err != nil:
		return nil, err
	case len(b) < 3 || b[len(b)-2] != '\r':
		return nil, fmt.Errorf("%w: malformed reply line %q", ErrRedisProtocol, b)
	}
	return b[:len(b)-2], nil
}

// bulkLen reads a bulk string's header and returns its length, -1 for the
// null bulk string; an error reply comes back as a *RedisError.
func (c *RedisConn) bulkLen() (int, error) {
	line, err := c.line()
	if err != nil {
		return 0, err
	}
	switch line[0] {
	case '$':
		n, err := strconv.Atoi(string(line[1:]))
		if err != nil || n < -1 {
			return 0, fmt.Errorf("%w: bad bulk length %q", ErrRedisProtocol, line)
		}
		return n, nil
	case '-':
		return 0, &RedisError{Msg: string(line[1:])}
	}
	return 0, fmt.Errorf("%w: %q where a bulk string was due", ErrRedisProtocol, line)
}

// crlf reads the CRLF that ends a bulk string.
func (c *RedisConn) crlf() error {
	var b [2]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return err
	}
	if !bytes.Equal(b[:], crlfBytes) {
		return fmt.Errorf("%w: bulk string not ended by CRLF", ErrRedisProtocol)
	}
	return nil
}

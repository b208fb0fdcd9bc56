package resp_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// startServer serves store (a fresh MemStore if nil) on a free loopback
// port until the test ends.
func startServer(t testing.TB, store resp.Store, cfg *resp.Config) (*resp.Server, string) {
	t.Helper()
	if store == nil {
		store = resptest.NewMemStore()
	}
	srv, err := resp.NewServer(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, resp.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return srv, ln.Addr().String()
}

// client is a minimal RESP2 client for tests and benchmarks.
type client struct {
	t  testing.TB
	nc net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func dial(t testing.TB, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	return &client{t: t, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10)}
}

// send writes one command as an array of bulk strings, unflushed.
func (c *client) send(args ...string) {
	fmt.Fprintf(c.bw, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.bw, "$%d\r\n", len(a))
		c.bw.WriteString(a)
		c.bw.WriteString("\r\n")
	}
}

// sendRaw writes bytes as they are and flushes.
func (c *client) sendRaw(s string) {
	c.t.Helper()
	c.bw.WriteString(s)
	c.flush()
}

func (c *client) flush() {
	c.t.Helper()
	if err := c.bw.Flush(); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// do sends one command and returns its reply, rendered by readReply.
func (c *client) do(args ...string) string {
	c.t.Helper()
	c.send(args...)
	c.flush()
	return c.read()
}

func (c *client) read() string {
	c.t.Helper()
	r, err := readReply(c.br)
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	return r
}

// readReply reads one reply and renders it compactly: +OK, -ERR msg, :3,
// "bulk" (Go-quoted), nil, [elem elem].
func readReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return "", fmt.Errorf("malformed reply line %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':':
		return line[:1] + body, nil
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("bad bulk length %q", body)
		}
		if n < 0 {
			return "nil", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(br, b); err != nil {
			return "", err
		}
		return strconv.Quote(string(b[:n])), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return "", fmt.Errorf("bad array length %q", body)
		}
		if n < 0 {
			return "nil", nil
		}
		elems := make([]string, n)
		for i := range elems {
			if elems[i], err = readReply(br); err != nil {
				return "", err
			}
		}
		return "[" + strings.Join(elems, " ") + "]", nil
	}
	return "", fmt.Errorf("unknown reply type in %q", line)
}

// readBulkInto reads a bulk string reply into dst (reused), for benchmarks.
func (c *client) readBulkInto(dst []byte) ([]byte, error) {
	line, err := c.br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if line[0] != '$' {
		return nil, fmt.Errorf("reply %q, want a bulk string", line)
	}
	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil || n < 0 {
		return nil, fmt.Errorf("bulk reply %q", line)
	}
	if cap(dst) < n+2 {
		dst = make([]byte, n+2)
	}
	dst = dst[:n+2]
	if _, err := io.ReadFull(c.br, dst); err != nil {
		return nil, err
	}
	return dst[:n], nil
}

// closed reports whether the server closed the connection: a read gets
// EOF or a reset within a second.
func (c *client) closed() bool {
	c.nc.SetReadDeadline(time.Now().Add(time.Second))
	defer c.nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := c.br.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

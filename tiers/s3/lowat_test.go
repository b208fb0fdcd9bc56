package s3

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// rcvlowat reads the connection's receive low-water mark from the kernel.
func rcvlowat(t *testing.T, c *markConn) int {
	t.Helper()
	var v int
	var err error
	if cerr := c.raw.Control(func(fd uintptr) {
		v, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMarkedBodyReadsToTheEnd sends bodies of sizes around the mark's
// limits over a real loopback connection, in small pieces with pauses, as
// a store might, and reads each through the HTTP client's buffer size of
// read-ahead. A mark asking for a byte more than is left would leave the
// read waiting; the read deadline turns that into a failure. Between
// bodies, the kernel's mark must be back to one byte.
func TestMarkedBodyReadsToTheEnd(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sizes := []int{1, bufferedBytes - 1, bufferedBytes, bufferedBytes + 1, 100_000,
		lowatBytes, lowatBytes + bufferedBytes - 1, lowatBytes + bufferedBytes, lowatBytes + bufferedBytes + 1, 3*lowatBytes + 12_345}
	var want []byte
	for _, n := range sizes {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		want = append(want, b...)
	}
	sent := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			sent <- err
			return
		}
		defer c.Close()
		for rest := want; len(rest) > 0; { // uneven pieces, now and then a pause
			n := min(len(rest), 1+len(rest)%(300<<10))
			if _, err := c.Write(rest[:n]); err != nil {
				sent <- err
				return
			}
			rest = rest[n:]
			if len(rest)%7 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		sent <- nil
	}()

	dial := dialMarked((&net.Dialer{}).DialContext)
	nc, err := dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c, ok := nc.(*markConn)
	if !ok {
		t.Fatalf("dialMarked made a %T, want a *markConn", nc)
	}
	must(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
	br := bufio.NewReaderSize(c, bufferedBytes) // as http.Transport reads a connection
	marked := false
	for i, n := range sizes {
		body := &markedBody{body: io.NopCloser(io.LimitReader(br, int64(n))), conn: c, left: int64(n)}
		got := make([]byte, n)
		for off := 0; off < n; {
			m, err := body.Read(got[off:min(n, off+512<<10)])
			if err != nil {
				t.Fatalf("body %d (%d bytes): read at %d: %v", i, n, off, err)
			}
			off += m
			marked = marked || rcvlowat(t, c) > 1
		}
		must(t, body.Close())
		if !bytes.Equal(got, want[:n]) {
			t.Fatalf("body %d (%d bytes) read wrong", i, n)
		}
		want = want[n:]
		if v := rcvlowat(t, c); v != 1 {
			t.Fatalf("after body %d, the connection's SO_RCVLOWAT is %d, want 1", i, v)
		}
	}
	if !marked {
		t.Fatal("no body was read with a low-water mark above one byte")
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

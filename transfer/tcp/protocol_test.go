package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/internal/frame"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// These tests speak the protocol byte by byte, to check what the Conn
// cannot show: when the server reads what, and what it does with a peer
// that breaks the rules.

func TestServerRefusesAnOversizedPutBeforeReadingItsPayloads(t *testing.T) {
	mem := transfertest.NewMemory()
	c := rawDial(t, serve(t, Options{MaxBlockSize: 1 << 20}, mem))
	small, big := transfertest.MakeBlock(1, 10), transfertest.MakeBlock(2, 2<<20)
	send(t, c, putFrames(small, big))
	// No payload has been sent: the refusal must come from the headers.
	st, flags, msg := readResponse(t, c)
	if st != frame.StatusRefused || flags != 0 || msg != "block 1 is 2.0 MiB, over the 1.0 MiB limit" {
		t.Fatalf("response = status %d, flags %d, %q; want a refusal naming block 1's size", st, flags, msg)
	}
	// The server skips the payloads and takes the next request.
	send(t, c, small.Data, big.Data, getFrame(small.Key))
	if st, _, msg := readResponse(t, c); st != frame.StatusOK {
		t.Fatalf("get after a refused put: status %d, %q", st, msg)
	}
	if _, st, _, _ := frame.DecodeHeader(recv(t, c, frame.HeaderSize)); st != frame.StatusNotFound {
		t.Errorf("block of the refused put: status %d, want NotFound", st)
	}
	if mem.Reserves() != 0 {
		t.Errorf("the server reserved %d blocks of a refused put", mem.Reserves())
	}
}

func TestServerClosesAfterRefusingAPutTooLargeToSkip(t *testing.T) {
	c := rawDial(t, serve(t, Options{MaxBlockSize: 1 << 20, MaxBlocks: 2}, transfertest.NewMemory()))
	huge := transfer.Block{Header: index.Header{Key: transfertest.Key(1), Meta: index.Meta{Size: 64 << 20}}}
	send(t, c, putFrames(huge))
	st, flags, msg := readResponse(t, c)
	if st != frame.StatusRefused || flags != flagClosing || !strings.Contains(msg, "64.0 MiB") {
		t.Fatalf("response = status %d, flags %d, %q; want a closing refusal", st, flags, msg)
	}
	wantEOF(t, c)
}

func TestServerAnswersAnUnknownOpAndCloses(t *testing.T) {
	c := rawDial(t, serve(t, Options{}, transfertest.NewMemory()))
	send(t, c, []byte{9, 0, 0, 0, 1, 0, 0, 0})
	st, flags, msg := readResponse(t, c)
	if st != frame.StatusError || flags != flagClosing || !strings.Contains(msg, "unknown op 0x09") {
		t.Fatalf("response = status %d, flags %d, %q; want an error naming the op", st, flags, msg)
	}
	wantEOF(t, c)
}

func TestServerRefusesAnotherProtocolVersion(t *testing.T) {
	addr := serve(t, Options{}, transfertest.NewMemory())
	c := rawConn(t, addr)
	hello := make([]byte, helloSize)
	putHello(hello, frame.StatusOK, 0)
	hello[4] = version + 1
	send(t, c, hello)
	_, st, msgLen, err := decodeHello(recv(t, c, helloSize))
	if err != nil || st != frame.StatusRefused {
		t.Fatalf("hello = status %d, %v; want a refusal", st, err)
	}
	if msg := string(recv(t, c, msgLen)); !strings.Contains(msg, "version 2 is not supported") {
		t.Errorf("refusal %q does not name the version", msg)
	}
	wantEOF(t, c)
}

func TestClientRejectsABlockForAnotherKey(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		recv(t, c, requestSize+frame.KeySize)
		resp := make([]byte, responseSize+frame.HeaderSize)
		putResponse(resp, frame.StatusOK, 0, 0, 1)
		frame.PutHeader(resp[responseSize:], &index.Header{Key: transfertest.Key(2)}, frame.StatusNotFound, 0)
		send(t, c, resp)
	})
	conn := dialer(t, Options{}, addr)
	err := conn.Get(context.Background(), []index.Key{transfertest.Key(1)}, transfertest.NewCollector(1))
	if err == nil || !strings.Contains(err.Error(), "protocol violation") {
		t.Fatalf("Get answered with another key = %v, want a protocol violation", err)
	}
	err = conn.Get(context.Background(), []index.Key{transfertest.Key(1)}, transfertest.NewCollector(1))
	if !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("Get after a protocol violation = %v, want ErrClosed", err)
	}
}

func TestClientRejectsABlockOverItsLimit(t *testing.T) {
	addr := fakeServer(t, func(c net.Conn) {
		recv(t, c, requestSize+frame.KeySize)
		resp := make([]byte, responseSize+frame.HeaderSize)
		putResponse(resp, frame.StatusOK, 0, 0, 1)
		frame.PutHeader(resp[responseSize:], &index.Header{Key: transfertest.Key(1), Meta: index.Meta{Size: 8 << 20}}, frame.StatusOK, 0)
		send(t, c, resp)
	})
	conn := dialer(t, Options{}, addr)
	col := transfertest.NewCollector(1)
	err := conn.Get(context.Background(), []index.Key{transfertest.Key(1)}, col)
	if err == nil || !strings.Contains(err.Error(), "8.0 MiB, over this client's 4.0 MiB limit") {
		t.Fatalf("Get of an 8 MiB block = %v, want it refused by the client's limit", err)
	}
	if col.Buffered[0] {
		t.Error("the client asked the receiver for an 8 MiB buffer")
	}
}

// serve serves h with opts on a free loopback port until the test ends.
func serve(t *testing.T, opts Options, h transfer.Handler) string {
	t.Helper()
	ln, err := New(opts).Listen("127.0.0.1:0", h)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr()
}

func dialer(t *testing.T, opts Options, addr string) transfer.Conn {
	t.Helper()
	c, err := New(opts).Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// fakeServer answers one connection's hello, then hands it to answer.
func fakeServer(t *testing.T, answer func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		recv(t, c, helloSize)
		hello := make([]byte, helloSize)
		putHello(hello, frame.StatusOK, 0)
		send(t, c, hello)
		answer(c)
		_, _ = io.Copy(io.Discard, c) // until the client closes
	}()
	return ln.Addr().String()
}

// rawConn connects to addr without a hello; rawDial also exchanges them.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func rawDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := rawConn(t, addr)
	hello := make([]byte, helloSize)
	putHello(hello, frame.StatusOK, 0)
	send(t, c, hello)
	if _, st, _, err := decodeHello(recv(t, c, helloSize)); err != nil || st != frame.StatusOK {
		t.Fatalf("hello: status %d, %v", st, err)
	}
	return c
}

// putFrames encodes a put request's header and block headers.
func putFrames(blocks ...transfer.Block) []byte {
	b := make([]byte, requestSize+len(blocks)*frame.HeaderSize)
	putRequest(b, opPut, len(blocks))
	for i := range blocks {
		frame.PutHeader(b[requestSize+i*frame.HeaderSize:], &blocks[i].Header, frame.StatusOK, 0)
	}
	return b
}

func getFrame(keys ...index.Key) []byte {
	b := make([]byte, requestSize+len(keys)*frame.KeySize)
	putRequest(b, opGet, len(keys))
	for i, k := range keys {
		frame.PutKey(b[requestSize+i*frame.KeySize:], k)
	}
	return b
}

func send(t *testing.T, c net.Conn, parts ...[]byte) {
	t.Helper()
	if _, err := c.Write(bytes.Join(parts, nil)); err != nil {
		t.Errorf("write: %v", err)
	}
}

func recv(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Errorf("read %d bytes: %v", n, err)
	}
	return b
}

func readResponse(t *testing.T, c net.Conn) (frame.Status, uint8, string) {
	t.Helper()
	st, flags, msgLen, _, err := decodeResponse(recv(t, c, responseSize))
	if err != nil {
		t.Fatalf("response: %v", err)
	}
	return st, flags, string(recv(t, c, msgLen))
}

// wantEOF checks that the server closed the connection (after its linger).
func wantEOF(t *testing.T, c net.Conn) {
	t.Helper()
	if n, err := io.Copy(io.Discard, c); err != nil || n != 0 {
		t.Errorf("after a closing answer: read %d more bytes, %v; want EOF", n, err)
	}
}

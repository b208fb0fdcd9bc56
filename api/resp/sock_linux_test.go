package resp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestRawSockIsUsedForTCP(t *testing.T) {
	_, server := tcpPair(t)
	if _, ok := newSock(server).(*rawSock); !ok {
		t.Fatalf("newSock(%T) = %T, want *rawSock", server, newSock(server))
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if s := newSock(a); s != io.ReadWriter(a) {
		t.Fatalf("newSock(pipe) = %T, want the pipe itself", s)
	}
}

// TestRawSockWriteBuffers writes more than the socket buffers hold, in
// more pieces than one writev takes, so that writes are partial, wait
// for room, and resume in the middle of a piece; the reader must get
// every byte in order.
func TestRawSockWriteBuffers(t *testing.T) {
	client, server := tcpPair(t)
	s := newSock(server).(*rawSock)
	var want bytes.Buffer
	var bufs [][]byte
	for i := range 3000 {
		b := bytes.Repeat([]byte{byte(i)}, 1+i*7%4000)
		if i%500 == 0 {
			b = make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j * 31)
			}
		}
		if i%97 == 0 {
			b = nil // empty pieces are skipped
		}
		bufs = append(bufs, b)
		want.Write(b)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(client)
		got <- b
	}()
	n, err := s.WriteBuffers(bufs)
	if err != nil || n != int64(want.Len()) {
		t.Fatalf("WriteBuffers: %d, %v; want %d", n, err, want.Len())
	}
	if _, err := s.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	want.WriteString("tail")
	server.(*net.TCPConn).CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Fatalf("read %d bytes, not the %d written in order", len(b), want.Len())
	}
}

func TestRawSockReadEOFDeadlineClose(t *testing.T) {
	client, server := tcpPair(t)
	s := newSock(server)
	buf := make([]byte, 16)

	server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := s.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	server.SetReadDeadline(time.Time{})

	client.Write([]byte("hello"))
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	client.Close()
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want io.EOF", n, err)
	}

	server.Close()
	if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v, want net.ErrClosed", err)
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v, want net.ErrClosed", err)
	}
}

// TestRawSockReadsWhileAnotherGoroutineWrites echoes 4 MiB through one
// socket whose reads and writes run in two goroutines at once, as
// net.Conn allows: neither direction may see the other's call.
func TestRawSockReadsWhileAnotherGoroutineWrites(t *testing.T) {
	client, server := tcpPair(t)
	s := newSock(server).(*rawSock)
	const total = 4 << 20
	want := bytes.Repeat([]byte("0123456789abcdef"), total/16)

	errs := make(chan error, 3)
	go func() { // the client sends everything and half-closes
		_, err := client.Write(want)
		client.(*net.TCPConn).CloseWrite()
		errs <- err
	}()
	var got bytes.Buffer
	go func() { // the client reads the echo
		_, err := io.Copy(&got, client)
		errs <- err
	}()
	pieces := make(chan []byte, 64)
	go func() { // the server writes what it reads, in its own goroutine
		var err error
		for p := range pieces {
			if err == nil {
				_, err = s.Write(p)
			}
		}
		server.(*net.TCPConn).CloseWrite()
		errs <- err
	}()
	for {
		buf := make([]byte, 7919)
		n, err := s.Read(buf)
		if n > 0 {
			pieces <- buf[:n]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	close(pieces)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("echo differs: got %d bytes, want %d", got.Len(), len(want))
	}
}

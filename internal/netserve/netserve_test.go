package netserve_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"iter"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/netserve"
)

// patience bounds every wait of these tests; none should come near it.
const patience = 10 * time.Second

// reqConn serves a toy protocol: the client sends a line, the connection
// answers "done <line>" once the test lets the request finish (finish),
// and waits for the next line.
type reqConn struct {
	nc     net.Conn
	finish chan struct{} // closed by the test: requests may answer

	mu         sync.Mutex
	busy, over bool
	started    chan struct{} // closed when the first request begins
	once       sync.Once
	cut        chan struct{} // closed by Cut
	cutOnce    sync.Once
}

func (c *reqConn) Serve() {
	defer c.nc.Close()
	r := bufio.NewReader(c.nc)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.over {
			c.mu.Unlock()
			return
		}
		c.busy = true
		c.mu.Unlock()
		c.once.Do(func() { close(c.started) })
		select {
		case <-c.finish:
		case <-c.cut:
			return
		}
		if _, err := io.WriteString(c.nc, "done "+line); err != nil {
			return
		}
		c.mu.Lock()
		c.busy = false
		over := c.over
		c.mu.Unlock()
		if over {
			return
		}
	}
}

func (c *reqConn) Drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.over = true
	if !c.busy {
		c.nc.Close()
	}
}

func (c *reqConn) Cut() {
	c.mu.Lock()
	c.over = true
	c.mu.Unlock()
	c.cutOnce.Do(func() { close(c.cut) })
	c.nc.Close()
}

// fixture is a Server on a loopback port, serving reqConns.
type fixture struct {
	t      *testing.T
	srv    *netserve.Server[*reqConn]
	addr   string
	finish chan struct{}
	served chan error // Serve's result

	mu    sync.Mutex
	conns []*reqConn
}

func start(t *testing.T, cfg netserve.Config[*reqConn]) *fixture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, addr: ln.Addr().String(), finish: make(chan struct{}), served: make(chan error, 1)}
	cfg.Open = func(nc net.Conn) *reqConn {
		c := &reqConn{nc: nc, finish: f.finish, started: make(chan struct{}), cut: make(chan struct{})}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		return c
	}
	f.srv = netserve.New(cfg)
	go func() { f.served <- f.srv.Serve(ln) }()
	t.Cleanup(func() { f.srv.Close() })
	return f
}

// conn returns the i-th connection the Server opened.
func (f *fixture) conn(i int) *reqConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns[i]
}

// client is one client connection of a test.
type client struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func (f *fixture) dial() *client {
	f.t.Helper()
	nc, err := net.Dial("tcp", f.addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(patience))
	return &client{t: f.t, nc: nc, r: bufio.NewReader(nc)}
}

func (c *client) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, line+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

// read returns the next line, or the error that ended the connection.
func (c *client) read() (string, error) {
	line, err := c.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// served waits until the Server serves n connections.
func (f *fixture) waitLen(n int) {
	f.t.Helper()
	deadline := time.Now().Add(patience)
	for f.srv.Len() != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("the server serves %d connections, want %d", f.srv.Len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestServeRetriesAFailedAcceptWithGrowingBackoff(t *testing.T) {
	server, clientEnd := net.Pipe()
	defer clientEnd.Close()
	ln := &flakyListener{fails: 4, conn: server, closed: make(chan struct{})}
	var retries []time.Duration
	var servedOne sync.WaitGroup
	servedOne.Add(1)
	srv := netserve.New(netserve.Config[*pipeConn]{
		Open: func(nc net.Conn) *pipeConn { return &pipeConn{nc: nc, done: servedOne.Done} },
		AcceptFailed: func(_ net.Listener, err error, retry time.Duration) {
			if !errors.Is(err, errNoFiles) {
				t.Errorf("AcceptFailed heard %v", err)
			}
			retries = append(retries, retry)
		},
	})
	result := make(chan error, 1)
	go func() { result <- srv.Serve(ln) }()
	servedOne.Wait() // the connection after the failures is served

	want := []time.Duration{5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}
	if !slices.Equal(retries, want) {
		t.Errorf("retried after %v, want %v", retries, want)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-result; !errors.Is(err, netserve.ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
}

func TestBackoffStopsAtMaxBackoffAndCloseEndsTheWait(t *testing.T) {
	ln := &flakyListener{fails: 1 << 30, closed: make(chan struct{})}
	var mu sync.Mutex
	var last time.Duration
	reached := make(chan struct{})
	srv := netserve.New(netserve.Config[*pipeConn]{
		Open: func(nc net.Conn) *pipeConn { return &pipeConn{nc: nc} },
		AcceptFailed: func(_ net.Listener, _ error, retry time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if retry > netserve.MaxBackoff {
				t.Errorf("retry in %v, over MaxBackoff", retry)
			}
			if retry == netserve.MaxBackoff && last != netserve.MaxBackoff {
				close(reached)
			}
			last = retry
		},
	})
	result := make(chan error, 1)
	go func() { result <- srv.Serve(ln) }()
	<-reached // after 5+10+…+640 ms ≈ 1.3 s of failures
	srv.Close()
	select {
	case err := <-result:
		if !errors.Is(err, netserve.ErrClosed) {
			t.Errorf("Serve after Close = %v, want ErrClosed", err)
		}
	case <-time.After(patience):
		t.Fatal("Serve still waits out its backoff after Close")
	}
}

func TestOverTheLimitIsRefusedInTheProtocolsWords(t *testing.T) {
	f := start(t, netserve.Config[*reqConn]{
		MaxConns: 1,
		Refuse:   func(nc net.Conn) { io.WriteString(nc, "full, try later\n") },
	})
	close(f.finish)
	first := f.dial()
	first.send("a")
	if got, err := first.read(); got != "done a" {
		t.Fatalf("first client got %q, %v", got, err)
	}
	second := f.dial()
	if got, _ := second.read(); got != "full, try later" {
		t.Errorf("second client, over the limit, got %q", got)
	}
	if _, err := second.read(); err != io.EOF {
		t.Errorf("the refused connection is not closed: %v", err)
	}

	first.nc.Close() // room again
	f.waitLen(0)
	third := f.dial()
	third.send("c")
	if got, err := third.read(); got != "done c" {
		t.Errorf("third client, after the first left, got %q, %v", got, err)
	}
}

func TestBeyondMaxRefusingConnectionsAreClosedWithoutAWord(t *testing.T) {
	refusing := make(chan struct{})
	hold := make(chan struct{})
	f := start(t, netserve.Config[*reqConn]{
		MaxConns: 1, MaxRefusing: 1,
		Refuse: func(nc net.Conn) {
			refusing <- struct{}{}
			<-hold
			io.WriteString(nc, "full\n")
		},
	})
	defer close(hold)
	f.dial() // served
	f.waitLen(1)
	f.dial() // being refused, held
	<-refusing
	third := f.dial()
	if got, err := third.read(); got != "" || err != io.EOF {
		t.Errorf("third client, beyond MaxRefusing, got %q, %v; want a bare close", got, err)
	}
}

func TestDisplaceMakesRoomForANewConnection(t *testing.T) {
	var f *fixture
	f = start(t, netserve.Config[*reqConn]{
		MaxConns: 1,
		Refuse:   func(nc net.Conn) { io.WriteString(nc, "full\n") },
		Displace: func(live iter.Seq[*reqConn]) (*reqConn, bool) {
			for c := range live {
				c.Cut()
				return c, true
			}
			return nil, false
		},
	})
	close(f.finish)
	old := f.dial()
	f.waitLen(1)
	c := f.dial()
	c.send("new")
	if got, err := c.read(); got != "done new" {
		t.Errorf("the new client got %q, %v", got, err)
	}
	if _, err := old.read(); err == nil {
		t.Error("the displaced client is still served")
	}
}

func TestShutdownLetsRequestsInFlightFinishAndClosesIdleOnes(t *testing.T) {
	f := start(t, netserve.Config[*reqConn]{})
	busy, idle := f.dial(), f.dial()
	busy.send("work")
	f.waitLen(2)
	<-f.conn(0).started

	shut := make(chan error, 1)
	go func() { shut <- f.srv.Shutdown(context.Background()) }()
	if err := <-f.served; !errors.Is(err, netserve.ErrClosed) {
		t.Errorf("Serve during Shutdown = %v, want ErrClosed", err)
	}
	if nc, err := net.Dial("tcp", f.addr); err == nil {
		nc.Close()
		t.Error("the server still takes connections during Shutdown")
	}
	if !f.srv.Draining() {
		t.Error("Draining() is false during Shutdown")
	}
	// Once a client can see the listener closed, an idle connection is
	// drained: a request sent now is not served.
	io.WriteString(idle.nc, "late\n")
	if got, err := idle.read(); err == nil {
		t.Errorf("an idle connection, at Shutdown, served %q", got)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	default:
	}

	close(f.finish)
	if got, err := busy.read(); got != "done work" {
		t.Errorf("the request in flight got %q, %v", got, err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if _, err := busy.read(); err != io.EOF {
		t.Errorf("after its request, the connection: %v, want it closed", err)
	}
}

func TestShutdownCutsWhatIsLeftAtItsDeadline(t *testing.T) {
	f := start(t, netserve.Config[*reqConn]{})
	stuck := f.dial()
	stuck.send("forever") // f.finish is never closed
	f.waitLen(1)
	<-f.conn(0).started

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := f.srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown past its deadline = %v, want DeadlineExceeded", err)
	}
	if _, err := stuck.read(); err == nil {
		t.Error("the request past the deadline was not cut")
	}
	if n := f.srv.Len(); n != 0 {
		t.Errorf("%d connections live after Shutdown returned", n)
	}
}

func TestCloseCutsEverythingAtOnce(t *testing.T) {
	refusing := make(chan struct{})
	f := start(t, netserve.Config[*reqConn]{
		MaxConns: 1,
		Refuse: func(nc net.Conn) {
			close(refusing)
			io.ReadAll(nc) // a refusal waiting on its client
		},
	})
	busy := f.dial()
	busy.send("work") // f.finish is never closed
	f.waitLen(1)
	<-f.conn(0).started
	refused := f.dial()
	<-refusing

	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := busy.read(); err == nil {
		t.Error("Close left a request in flight running")
	}
	if _, err := refused.read(); err == nil {
		t.Error("Close left a refusal running")
	}
	if err := <-f.served; !errors.Is(err, netserve.ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
	if err := f.srv.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown after Close = %v, want nil", err)
	}
}

func TestServeAfterShutdownClosesTheListener(t *testing.T) {
	srv := netserve.New(netserve.Config[*pipeConn]{Open: func(nc net.Conn) *pipeConn { return &pipeConn{nc: nc} }})
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(ln); !errors.Is(err, netserve.ErrClosed) {
		t.Errorf("Serve after Shutdown = %v, want ErrClosed", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the listener given after Shutdown is open: %v", err)
	}
}

var errNoFiles = errors.New("accept: too many open files")

// flakyListener fails its first fails Accepts, then hands out conn (if
// any), then blocks until closed.
type flakyListener struct {
	mu     sync.Mutex
	fails  int
	conn   net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		default:
			return nil, errNoFiles
		}
	}
	c := l.conn
	l.conn = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *flakyListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *flakyListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// pipeConn is served until it is cut.
type pipeConn struct {
	nc   net.Conn
	done func()
}

func (c *pipeConn) Serve() {
	if c.done != nil {
		c.done()
	}
	io.Copy(io.Discard, c.nc)
	c.nc.Close()
}
func (c *pipeConn) Drain() { c.nc.Close() }
func (c *pipeConn) Cut()   { c.nc.Close() }

func TestStartServesInTheBackgroundAndCloseWaitsForIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := netserve.New(netserve.Config[*pipeConn]{Open: func(nc net.Conn) *pipeConn { return &pipeConn{nc: nc} }})
	srv.Start(ln)
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(patience))
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("after Close, the started listener is open: %v", err)
	}
	if _, err := nc.Read(make([]byte, 1)); err == nil {
		t.Error("after Close, the connection is open")
	}
}

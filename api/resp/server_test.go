package resp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// Pipelined commands (redis-benchmark -P 16) are all answered, in order.
func TestPipelinedCommandsAreAnsweredInOrder(t *testing.T) {
	store := resptest.NewMemStore()
	_, addr := startServer(t, store, nil)
	c := dial(t, addr)
	big := strings.Repeat("b", 100<<10)
	const n = 2000
	var want []string
	for i := range n {
		k, v := fmt.Sprint("key", i), fmt.Sprint("value", i)
		if i%100 == 0 {
			v = big + v
		}
		c.send("SET", k, v)
		c.send("GET", k)
		c.send("EXISTS", k, "nope")
		want = append(want, "+OK", fmt.Sprintf("%q", v), ":1")
	}
	c.bw.WriteString("PING\r\n") // an inline command in the pipeline
	want = append(want, "+PONG")

	// Write while reading: the server stops reading while its replies are
	// not read, as Redis does.
	go c.flush()
	for i, w := range want {
		if got := c.read(); got != w {
			t.Fatalf("reply %d: got %.40s…, want %.40s…", i, got, w)
		}
	}
	waitFor(t, "all views released", func() bool { return store.OpenViews() == 0 })
}

func TestManyConcurrentClients(t *testing.T) {
	srv, addr := startServer(t, nil, nil)
	const clients, ops = 32, 100
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c := dial(t, addr)
			for j := range ops {
				k, v := fmt.Sprintf("c%d-k%d", i, j%10), fmt.Sprintf("v%d-%d", i, j)
				if j%25 == 0 { // some values long enough to be written from the store's memory
					v += strings.Repeat("x", 20<<10)
				}
				c.send("SET", k, v)
				c.send("GET", k)
				c.flush()
				if got := c.read(); got != "+OK" {
					t.Errorf("client %d SET: %s", i, got)
					return
				}
				if got := c.read(); got != fmt.Sprintf("%q", v) {
					t.Errorf("client %d GET %s: %.40s…", i, k, got)
					return
				}
			}
			if got := c.do("QUIT"); got != "+OK" {
				t.Errorf("QUIT: %s", got)
			}
		})
	}
	wg.Wait()
	st := srv.Stats()
	if st.Commands["set"] != clients*ops || st.Commands["get"] != clients*ops || st.Commands["quit"] != clients {
		t.Errorf("command counts %v, want %d sets and gets, %d quits", st.Commands, clients*ops, clients)
	}
	if n := dial(t, addr).do("DBSIZE"); n != fmt.Sprintf(":%d", clients*10) {
		t.Errorf("DBSIZE %s, want %d", n, clients*10)
	}
}

// Input that is not RESP gets a protocol error and closes that connection
// only: the server keeps serving the others.
func TestMalformedInputClosesOnlyThatConnection(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{MaxBulkLen: 1 << 20})
	good := dial(t, addr)
	run(t, good, []step{{cmd("SET k v"), "+OK"}})
	for _, tc := range []struct{ in, want string }{
		{"*1\r\n$-5\r\n", "-ERR Protocol error: invalid bulk length"},
		{"*2\r\n$3\r\nGET\r\n:1\r\n", "-ERR Protocol error: expected '$', got ':'"},
		{"*abc\r\n", "-ERR Protocol error: invalid multibulk length"},
		{"SET \"unbalanced\r\n", "-ERR Protocol error: unbalanced quotes in request"},
		{strings.Repeat("x", 100<<10), "-ERR Protocol error: too big inline request"},
		{"*1\r\n$3\r\nGETX\r\n", "-ERR Protocol error: expected '\\r\\n' after bulk string, got \"X\\r\""},
	} {
		bad := dial(t, addr)
		run(t, bad, []step{{cmd("PING"), "+PONG"}})
		bad.sendRaw(tc.in)
		if got := bad.read(); got != tc.want {
			t.Errorf("%.20q…: got %s, want %s", tc.in, got, tc.want)
		}
		if !bad.closed() {
			t.Errorf("%.20q…: connection still open", tc.in)
		}
		run(t, good, []step{{cmd("GET k"), `"v"`}})
	}
	if st := srv.Stats(); st.ProtocolErrors != 6 {
		t.Errorf("%d protocol errors counted, want 6", st.ProtocolErrors)
	}
}

func TestClientsOverMaxClientsAreTurnedAway(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{MaxClients: 2})
	a, b := dial(t, addr), dial(t, addr)
	run(t, a, []step{{cmd("PING"), "+PONG"}})
	run(t, b, []step{{cmd("PING"), "+PONG"}})
	over := dial(t, addr)
	if got := over.read(); got != "-ERR max number of clients reached" {
		t.Fatalf("third client got %s", got)
	}
	if !over.closed() {
		t.Fatal("third client still connected")
	}
	a.nc.Close()
	waitFor(t, "the first client to be gone", func() bool { return srv.Stats().ConnectedClients == 1 })
	run(t, dial(t, addr), []step{{cmd("PING"), "+PONG"}})
	if st := srv.Stats(); st.RejectedConnections != 1 {
		t.Errorf("%d rejected connections, want 1", st.RejectedConnections)
	}
}

func TestIdleConnectionsAreClosedAfterIdleTimeout(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{IdleTimeout: time.Second})
	idle, busy := dial(t, addr), dial(t, addr)
	giveUp := time.Now().Add(10 * time.Second)
	for srv.Stats().IdleClosed == 0 { // busy never waits a second between commands
		if time.Now().After(giveUp) {
			t.Fatal("no connection closed 10 s after its IdleTimeout of 1 s")
		}
		run(t, busy, []step{{cmd("PING"), "+PONG"}})
		time.Sleep(50 * time.Millisecond)
	}
	if !idle.closed() {
		t.Fatal("idle connection still open")
	}
	run(t, busy, []step{{cmd("PING"), "+PONG"}})
	if st := srv.Stats(); st.IdleClosed != 1 {
		t.Errorf("%d idle connections closed, want 1", st.IdleClosed)
	}
}

// Close stops accepting, closes the connections, and waits for their
// goroutines; Serve then returns ErrServerClosed (checked by startServer).
func TestCloseStopsServing(t *testing.T) {
	srv, addr := startServer(t, nil, nil)
	clients := []*client{dial(t, addr), dial(t, addr)}
	run(t, clients[0], []step{{cmd("PING"), "+PONG"}})
	clients[1].sendRaw("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\npartial") // mid-command
	waitFor(t, "both clients served", func() bool { return srv.Stats().ConnectedClients == 2 })

	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for i, c := range clients {
		if !c.closed() {
			t.Errorf("client %d still connected after Close", i)
		}
	}
	if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		nc.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := nc.Read(make([]byte, 1)); err != io.EOF && !errors.Is(err, net.ErrClosed) && !strings.Contains(fmt.Sprint(err), "reset") {
			t.Errorf("new connection after Close: read %v, want it closed", err)
		}
		nc.Close()
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := srv.Serve(newListener(t)); !errors.Is(err, resp.ErrServerClosed) {
		t.Errorf("Serve after Close: %v", err)
	}
}

func newListener(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestStatsCountCommandsByName(t *testing.T) {
	srv, addr := startServer(t, nil, nil)
	c := dial(t, addr)
	for _, words := range []string{"SET k v", "get k", "GET k", "GET", "CLIENT SETNAME x", "client id", "NOPE", "ping"} {
		c.do(cmd(words)...)
	}
	st := srv.Stats()
	want := map[string]uint64{"set": 1, "get": 3, "client": 2, "ping": 1}
	if fmt.Sprint(st.Commands) != fmt.Sprint(want) {
		t.Errorf("Commands = %v, want %v", st.Commands, want)
	}
	if st.UnknownCommands != 1 || st.ErrorReplies != 2 || st.ConnectedClients != 1 || st.AcceptedConnections != 1 {
		t.Errorf("stats %+v: want 1 unknown command, 2 error replies, 1 client, 1 accepted", st)
	}
	if st.NetInputBytes == 0 || st.NetOutputBytes == 0 {
		t.Errorf("no bytes counted: %+v", st)
	}
}

func TestConfigValidationReportsEveryProblem(t *testing.T) {
	_, err := resp.NewServer(resptest.NewMemStore(), &resp.Config{
		MaxClients: -1, MaxBulkLen: 2 << 30, MaxArgs: -2, MaxCommandBytes: 10,
		ReadBufferSize: 100, WriteBufferSize: 100, IdleTimeout: -time.Second,
	})
	if !errors.Is(err, resp.ErrInvalidConfig) {
		t.Fatalf("got %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"max clients is -1", "max bulk length is 2147483648", "max args is -2", "max command bytes is 10",
		"read buffer size is 100", "write buffer size is 100", "idle timeout is -1s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := resp.NewServer(nil, nil); !errors.Is(err, resp.ErrInvalidConfig) {
		t.Errorf("NewServer(nil store): %v", err)
	}
	var cfg resp.Config
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil || cfg.MaxBulkLen != resp.DefaultMaxBulkLen || cfg.Version == "" {
		t.Errorf("defaults %+v: %v", cfg, err)
	}
}

// Shutdown closes idle connections at once and lets a command that is on
// its way finish, reply and then close.
func TestShutdownFinishesTheCommandInFlight(t *testing.T) {
	for _, idleTimeout := range []time.Duration{0, time.Minute} {
		store := resptest.NewMemStore()
		srv, addr := startServer(t, store, &resp.Config{IdleTimeout: idleTimeout})
		idle, busy := dial(t, addr), dial(t, addr)
		run(t, idle, []step{{cmd("PING"), "+PONG"}})
		part := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nhello"
		busy.sendRaw(part) // half of the value
		waitFor(t, "the partial command read", func() bool {
			return srv.Stats().NetInputBytes >= uint64(len("*1\r\n$4\r\nPING\r\n")+len(part))
		})

		done := make(chan error, 1)
		go func() { done <- srv.Shutdown(context.Background()) }()
		if !idle.closed() {
			t.Fatalf("idle timeout %v: an idle connection is still open during Shutdown", idleTimeout)
		}
		// A new connection is not served: the dial fails once the listener
		// is closed, or, in the moment before, the connection is closed
		// without an answer.
		if nc, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			nc.SetDeadline(time.Now().Add(5 * time.Second))
			nc.Write([]byte("PING\r\n"))
			reply, _ := bufio.NewReader(nc).ReadString('\n')
			nc.Close()
			if reply != "" {
				t.Fatalf("idle timeout %v: a new connection was served during Shutdown: %q", idleTimeout, reply)
			}
		}
		busy.sendRaw("world\r\n")
		if got := busy.read(); got != "+OK" {
			t.Fatalf("idle timeout %v: the command in flight got %q", idleTimeout, got)
		}
		if !busy.closed() {
			t.Fatalf("idle timeout %v: the connection stayed open after its command", idleTimeout)
		}
		if err := <-done; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if ok, _ := store.Exists(context.Background(), "k"); !ok {
			t.Fatal("the acknowledged SET is not in the store")
		}
	}
}

func TestShutdownCutsACommandThatMissesTheDeadline(t *testing.T) {
	store := resptest.NewMemStore()
	srv, addr := startServer(t, store, nil)
	busy := dial(t, addr)
	part := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nhello"
	busy.sendRaw(part)
	waitFor(t, "the partial command read", func() bool { return srv.Stats().NetInputBytes >= uint64(len(part)) })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with a command stuck half-sent: %v; want the deadline's error", err)
	}
	if !busy.closed() {
		t.Fatal("the stuck connection is still open")
	}
	if ok, _ := store.Exists(context.Background(), "k"); ok {
		t.Fatal("half a SET was applied")
	}
}

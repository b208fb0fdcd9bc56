package resp_test

import (
	"bufio"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
)

// stallSET is the start of a SET that announces a 16 MiB value and sends
// none of it.
const stallSET = "*3\r\n$3\r\nSET\r\n$6\r\nstall0\r\n$16777216\r\n"

// stall opens n connections that each send part, then nothing more. It
// returns them; the test's end closes them.
func stall(t *testing.T, addr string, n int, part string) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		if _, err := nc.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
	}
	return conns
}

// wellBehaved connects afresh, SETs and GETs a small value, and returns
// the replies, retrying while the server is at its client limit; all of it
// must happen before deadline.
func wellBehaved(addr, key string, deadline time.Time) error {
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			return err
		}
		nc.SetDeadline(deadline)
		br := bufio.NewReader(nc)
		fmt.Fprintf(nc, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$5\r\nhello\r\n*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key, len(key), key)
		set, err := br.ReadString('\n')
		if strings.HasPrefix(set, "-ERR max number of clients reached") {
			nc.Close()
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			nc.Close()
			return fmt.Errorf("SET %s: %q, %v", key, set, err)
		}
		hdr, err1 := br.ReadString('\n')
		val, err2 := br.ReadString('\n')
		nc.Close()
		if set != "+OK\r\n" || hdr != "$5\r\n" || val != "hello\r\n" || err1 != nil || err2 != nil {
			return fmt.Errorf("SET/GET %s: %q %q %q (%v, %v)", key, set, hdr, val, err1, err2)
		}
		return nil
	}
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// As many connections as the server serves, each stalled after announcing
// a 16 MiB value, neither lock other clients out nor make the server
// allocate what they announced.
func TestStalledCommandsDoNotLockOutOthers(t *testing.T) {
	const maxClients = 64
	before := heapAlloc()
	srv, addr := startServer(t, nil, &resp.Config{MaxClients: maxClients})
	stalled := stall(t, addr, maxClients, stallSET)
	waitFor(t, "every stalled connection served", func() bool {
		st := srv.Stats()
		return st.ConnectedClients == maxClients && st.NetInputBytes >= uint64(maxClients*len(stallSET))
	})
	if grown := heapAlloc() - min(before, heapAlloc()); grown > 64<<20 {
		t.Errorf("the heap grew by %d MiB for %d stalled 16 MiB SETs", grown>>20, maxClients)
	}
	for i := range 5 {
		if err := wellBehaved(addr, fmt.Sprint("good", i), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("a well-behaved client was not answered before its 5 s deadline: %v", err)
		}
	}
	// An evicted client is told why. The server counts an eviction when
	// the evicted connection's own goroutine ends it, so the count is read
	// once every stalled client has had its answer.
	var told atomic.Int64
	var wg sync.WaitGroup
	for _, nc := range stalled { // all at once: those not evicted wait out the deadline
		wg.Go(func() {
			nc.SetReadDeadline(time.Now().Add(2 * time.Second))
			line, _ := bufio.NewReader(nc).ReadString('\n')
			if strings.HasPrefix(line, "-ERR connection closed for a new client") {
				told.Add(1)
			}
		})
	}
	wg.Wait()
	st := srv.Stats()
	if st.EvictedClients == 0 || st.EvictedClients > 5 {
		t.Errorf("%d connections evicted for 5 new ones", st.EvictedClients)
	}
	if told := told.Load(); told != int64(st.EvictedClients) {
		t.Errorf("%d evicted clients were told why, want %d", told, st.EvictedClients)
	}
}

// A command whose bytes trickle in slower than MinReadRate is cut when
// its allowance runs out, though no gap between bytes is long.
func TestTricklingCommandIsCutByItsRate(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{CommandTimeout: 300 * time.Millisecond, MinReadRate: 1000})
	nc := stall(t, addr, 1, stallSET)[0]
	cut := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(nc).ReadString('\n')
		cut <- line
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(10 * time.Second)
	for {
		select {
		case line := <-cut:
			if !strings.HasPrefix(line, "-ERR command not received in time") {
				t.Fatalf("the trickling client got %q", line)
			}
			if st := srv.Stats(); st.SlowClosed != 1 {
				t.Errorf("%d slow connections closed, want 1", st.SlowClosed)
			}
			return
		case <-tick.C:
			nc.Write([]byte("x")) // 20 bytes/s: each gap short, the rate far too low
		case <-giveUp:
			t.Fatal("a command trickling in at 20 bytes/s is still being read after 10 s")
		}
	}
}

// A command that arrives at a good pace is read whole, however long it
// takes past CommandTimeout.
func TestSteadyCommandOutlivesCommandTimeout(t *testing.T) {
	_, addr := startServer(t, nil, &resp.Config{CommandTimeout: 200 * time.Millisecond, MinReadRate: 16 << 10})
	c := dial(t, addr)
	value := strings.Repeat("v", 256<<10)
	c.sendRaw(fmt.Sprintf("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n", len(value)))
	for i := 0; i < len(value); i += 16 << 10 { // 160 KiB/s, for 1.6 s: ten times the minimum
		c.sendRaw(value[i : i+16<<10])
		time.Sleep(100 * time.Millisecond)
	}
	c.sendRaw("\r\n")
	if got := c.read(); got != "+OK" {
		t.Fatalf("SET at 160 KiB/s, over a minimum of 16 KiB/s: %s", got)
	}
}

// Unfinished MSETs hold at most MaxPendingBytes between them; the ones
// that cannot have more wait, then are told the server is busy, while
// short commands of other clients go on being answered.
func TestUnfinishedCommandsHoldAtMostMaxPendingBytes(t *testing.T) {
	const (
		value   = 256 << 10
		pending = 4 << 20
		clients = 6
	)
	srv, addr := startServer(t, nil, &resp.Config{MaxBulkLen: value, MaxCommandBytes: 2 << 20,
		MaxPendingBytes: pending, CommandTimeout: time.Second})
	// Each MSET announces 7 values and sends all of them but the last byte.
	var b strings.Builder
	b.WriteString("*15\r\n$4\r\nMSET\r\n")
	v := strings.Repeat("m", value)
	for i := range 7 {
		fmt.Fprintf(&b, "$2\r\nk%d\r\n$%d\r\n%s", i, value, v)
		if i < 6 {
			b.WriteString("\r\n")
		}
	}
	msets := b.String()[:b.Len()-1]
	var wg sync.WaitGroup
	replies := make(chan string, clients)
	for i := range clients {
		if i == 1 || i == 2 {
			// The first two MSETs fit the budget whole: each is let in
			// before the next starts, so they hold their bytes (and are
			// cut as slow) and the later ones wait (and find it busy).
			// Started together, all six could hold part of it and wait.
			want := int64(i) * 3 << 19 // 1.5 MiB each
			waitFor(t, "an MSET held whole", func() bool { return srv.Stats().PendingBytes >= want })
		}
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		wg.Go(func() {
			go nc.Write([]byte(msets)) // blocks once the server stops reading
			nc.SetReadDeadline(time.Now().Add(30 * time.Second))
			line, _ := bufio.NewReader(nc).ReadString('\n')
			replies <- line
		})
	}
	deadline := time.Now().Add(900 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		if p := srv.Stats().PendingBytes; p > pending {
			t.Fatalf("unfinished commands hold %d bytes, over MaxPendingBytes %d", p, pending)
		}
		if err := wellBehaved(addr, fmt.Sprint("good", i), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("a well-behaved client was not answered before its 5 s deadline: %v", err)
		}
	}
	wg.Wait()
	close(replies)
	var busy, slow int
	for r := range replies {
		switch {
		case strings.HasPrefix(r, "-ERR server busy"):
			busy++
		case strings.HasPrefix(r, "-ERR command not received in time"):
			slow++
		default:
			t.Errorf("an unfinished MSET got %q", r)
		}
	}
	if busy == 0 || slow == 0 {
		t.Errorf("%d MSETs found the server busy and %d were cut as slow; want some of each", busy, slow)
	}
	waitFor(t, "the memory handed back", func() bool { return srv.Stats().PendingBytes == 0 })
}

// A full server makes room for a new client by closing the client idle
// longest, once it has been idle past CommandTimeout; clients idle for
// less keep their connections.
func TestFullServerDisplacesTheLongestIdleClient(t *testing.T) {
	srv, addr := startServer(t, nil, &resp.Config{MaxClients: 2, CommandTimeout: 200 * time.Millisecond})
	oldest, other := dial(t, addr), dial(t, addr)
	run(t, oldest, []step{{cmd("PING"), "+PONG"}})
	time.Sleep(100 * time.Millisecond)
	run(t, other, []step{{cmd("PING"), "+PONG"}})
	time.Sleep(250 * time.Millisecond) // both idle past CommandTimeout, oldest the longest
	run(t, dial(t, addr), []step{{cmd("PING"), "+PONG"}})
	if !oldest.closed() {
		t.Fatal("the client idle longest is still connected")
	}
	run(t, other, []step{{cmd("PING"), "+PONG"}})
	if st := srv.Stats(); st.EvictedClients != 1 {
		t.Errorf("%d clients displaced, want 1", st.EvictedClients)
	}
}

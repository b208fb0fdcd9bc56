package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeRedis serves RESP2 commands on loopback, answering each with reply's
// raw bytes ("" sends nothing), and records the raw commands it read.
type fakeRedis struct {
	addr     string
	commands chan string
}

func startFakeRedis(t *testing.T, reply func(args []string) string) *fakeRedis {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{addr: lis.Addr().String(), commands: make(chan string, 100)}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			nc, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					args, raw, err := readCommand(r)
					if err != nil {
						return
					}
					f.commands <- raw
					if s := reply(args); s != "" {
						io.WriteString(nc, s)
					}
				}
			}()
		}
	}()
	return f
}

// readCommand reads one RESP2 array of bulk strings.
func readCommand(r *bufio.Reader) (args []string, raw string, err error) {
	var sb strings.Builder
	line := func() (string, error) {
		s, err := r.ReadString('\n')
		sb.WriteString(s)
		return strings.TrimSuffix(s, "\r\n"), err
	}
	head, err := line()
	if err != nil {
		return nil, "", err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(head, "*"))
	if err != nil {
		return nil, "", fmt.Errorf("not an array: %q", head)
	}
	for range n {
		l, err := line()
		if err != nil {
			return nil, "", err
		}
		size, _ := strconv.Atoi(strings.TrimPrefix(l, "$"))
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, "", err
		}
		sb.Write(b)
		args = append(args, string(b[:size]))
	}
	return args, sb.String(), nil
}

func dialFake(t *testing.T, f *fakeRedis, timeout time.Duration) *RedisConn {
	t.Helper()
	c, err := DialRedis(context.Background(), f.addr, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if got := <-f.commands; got != "*1\r\n$4\r\nPING\r\n" {
		t.Fatalf("dial sent %q, want a PING", got)
	}
	return c
}

func TestRedisSetSendsOneRESP2ArrayAndReadsOK(t *testing.T) {
	f := startFakeRedis(t, func(args []string) string {
		if args[0] == "PING" {
			return "+PONG\r\n"
		}
		return "+OK\r\n"
	})
	c := dialFake(t, f, time.Second)
	if err := c.Set(context.Background(), []byte("k:1"), []byte("hello\r\nworld")); err != nil {
		t.Fatal(err)
	}
	if got, want := <-f.commands, "*3\r\n$3\r\nSET\r\n$3\r\nk:1\r\n$12\r\nhello\r\nworld\r\n"; got != want {
		t.Fatalf("SET sent %q, want %q", got, want)
	}
}

func TestRedisGetReadsBulkStringsIntoTheCallersBuffer(t *testing.T) {
	big := strings.Repeat("x", 300<<10) // larger than the read buffer
	f := startFakeRedis(t, func(args []string) string {
		switch args[len(args)-1] {
		case "PING":
			return "+PONG\r\n"
		case "big":
			return "$" + strconv.Itoa(len(big)) + "\r\n" + big + "\r\n"
		case "empty":
			return "$0\r\n\r\n"
		case "small":
			return "$5\r\nab\r\nc\r\n"
		}
		return "$-1\r\n"
	})
	c := dialFake(t, f, time.Second)
	ctx := context.Background()
	buf := make([]byte, 0, 16)
	v, found, err := c.Get(ctx, []byte("small"), buf)
	if err != nil || !found || string(v) != "ab\r\nc" || &v[0] != &buf[:1][0] {
		t.Fatalf("small: %q found %v err %v (in the caller's buffer: want yes)", v, found, err)
	}
	v, found, err = c.Get(ctx, []byte("big"), buf)
	if err != nil || !found || string(v) != big {
		t.Fatalf("big: %d bytes found %v err %v", len(v), found, err)
	}
	v, found, err = c.Get(ctx, []byte("empty"), buf)
	if err != nil || !found || len(v) != 0 {
		t.Fatalf("empty: %q found %v err %v", v, found, err)
	}
	v, found, err = c.Get(ctx, []byte("missing"), buf)
	if err != nil || found || v != nil {
		t.Fatalf("missing: %q found %v err %v", v, found, err)
	}
}

func TestRedisErrorReplyKeepsTheConnection(t *testing.T) {
	f := startFakeRedis(t, func(args []string) string {
		if args[0] == "SET" {
			return "-OOM command not allowed when used memory > 'maxmemory'\r\n"
		}
		return "+PONG\r\n"
	})
	c := dialFake(t, f, time.Second)
	err := c.Set(context.Background(), []byte("k"), []byte("v"))
	var re *RedisError
	if !errors.As(err, &re) || !strings.HasPrefix(re.Msg, "OOM command not allowed") {
		t.Fatalf("SET into a full server: %v", err)
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Fatalf("PING after an error reply: %v", err)
	}
}

func TestRedisGarbageBreaksTheConnection(t *testing.T) {
	f := startFakeRedis(t, func(args []string) string {
		if args[0] == "PING" {
			return "+PONG\r\n"
		}
		return ":12\r\n"
	})
	c := dialFake(t, f, time.Second)
	_, _, err := c.Get(context.Background(), []byte("k"), nil)
	if !errors.Is(err, ErrRedisProtocol) || !strings.Contains(err.Error(), `":12" where a bulk string was due`) {
		t.Fatalf("GET answered with an integer: %v", err)
	}
	if err := c.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "where a bulk string was due") {
		t.Fatalf("PING on a broken connection: %v, want the earlier error", err)
	}
}

func TestRedisSilentServerTimesOutAndCancelInterrupts(t *testing.T) {
	f := startFakeRedis(t, func(args []string) string {
		if args[0] == "PING" {
			return "+PONG\r\n"
		}
		return "" // never answer
	})
	c := dialFake(t, f, 100*time.Millisecond)
	start := time.Now()
	_, _, err := c.Get(context.Background(), []byte("k"), nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("GET to a silent server: %v after %v", err, time.Since(start))
	}
	<-f.commands // the GET

	c = dialFake(t, f, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start = time.Now()
	_, _, err = c.Get(ctx, []byte("k"), nil)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("cancelled GET: %v after %v", err, time.Since(start))
	}
}

func TestDialRedisWantsPONG(t *testing.T) {
	f := startFakeRedis(t, func([]string) string { return "-NOAUTH Authentication required.\r\n" })
	_, err := DialRedis(context.Background(), f.addr, time.Second)
	if err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("dial of a server that wants a password: %v", err)
	}
}

func TestRedisRoundTripsOneMiBWithARealServer(t *testing.T) {
	addr := startRedisServer(t)
	c, err := DialRedis(context.Background(), addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	content, _ := NewContent(1<<20, 7)
	ctx := context.Background()
	if err := c.Set(ctx, []byte("k"), content.Of(1)); err != nil {
		t.Fatal(err)
	}
	v, found, err := c.Get(ctx, []byte("k"), nil)
	if err != nil || !found || !bytes.Equal(v, content.Of(1)) {
		t.Fatalf("GET after SET: %d bytes, found %v, err %v", len(v), found, err)
	}
	if _, found, err := c.Get(ctx, []byte("nope"), nil); err != nil || found {
		t.Fatalf("GET of a missing key: found %v, err %v", found, err)
	}
}

// startRedisServer starts /usr/bin/redis-server (or the one on PATH) on a
// free port, without persistence, and returns its address; it skips the
// test when none is installed.
func startRedisServer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (apt-get install redis-server); skipping the real-Redis test")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	lis.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := DialRedis(context.Background(), addr, time.Second); err == nil {
			c.Close()
			return addr
		}
	}
	t.Fatalf("redis-server on %s did not answer PING within 5s", addr)
	return ""
}

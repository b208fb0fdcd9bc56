package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/loadgen"
)

// benchJSON runs kvctl bench with args and -o json and decodes its output.
func benchJSON(t *testing.T, args ...string) benchOutput {
	t.Helper()
	code, out, stderr := run(t, append(append([]string{"bench"}, args...), "-o", "json")...)
	var got benchOutput
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil {
		t.Fatalf("bench %v: status %d, %v, stderr %q, output:\n%s", args, code, err, stderr, out)
	}
	return got
}

func TestBenchGetAgainstTheNodePrintsATable(t *testing.T) {
	addr, _ := startNode(t)
	code, out, stderr := run(t, "--addr", addr, "bench", "--op", "get", "--size", "64KiB", "--keys", "8",
		"--requests", "40", "--concurrency", "4")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	lines := strings.Split(out, "\n")
	wantHead := fmt.Sprintf("kvstrata://%s over the data plane (tcp): get of 64.0 KiB values, 8 keys in namespace %s, batch 1, concurrency 4",
		addr, benchNamespace)
	if lines[0] != wantHead {
		t.Errorf("first line %q, want %q", lines[0], wantHead)
	}
	if got := strings.Fields(lines[2]); strings.Join(got, " ") != "PHASE REQUESTS OPS BYTES SECONDS OPS/S MB/S GB/S P50 P99 P999 MAX ERRORS" {
		t.Errorf("header %q", lines[2])
	}
	if f := strings.Fields(lines[3]); len(f) != 14 || strings.Join(f[:5], " ") != "populate 8 8 512.0 KiB" || f[13] != "0" {
		t.Errorf("populate row %q", lines[3])
	}
	if f := strings.Fields(lines[4]); len(f) != 14 || strings.Join(f[:5], " ") != "run 40 40 2.5 MiB" || f[13] != "0" {
		t.Errorf("run row %q", lines[4])
	}
}

func TestBenchEveryOpOverBothPaths(t *testing.T) {
	addr, _ := startNode(t)
	for _, c := range []struct {
		args      []string
		path      string
		ops       int64
		bytes     int64
		populated bool
	}{
		{[]string{"--op", "put", "--batch", "4"}, "tcp", 80, 80 * 4096, false},
		{[]string{"--op", "get", "--grpc"}, "grpc", 20, 20 * 4096, true},
		{[]string{"--op", "lookup", "--batch", "8"}, "tcp", 160, 0, true},
		{[]string{"--op", "mixed", "--get-ratio", "0.5", "--grpc"}, "grpc", 20, 20 * 4096, true},
	} {
		got := benchJSON(t, append([]string{"--addr", addr, "--size", "4KiB", "--keys", "16", "--requests", "20", "-c", "3"}, c.args...)...)
		r := got.Run
		if got.Path != c.path || r.Requests != 20 || r.Ops != c.ops || r.Bytes != c.bytes || r.Errors != 0 || r.Misses != 0 {
			t.Errorf("%v: path %s, %d requests, %d ops, %d bytes, %d errors, %d misses; want %s, 20, %d, %d, none",
				c.args, got.Path, r.Requests, r.Ops, r.Bytes, r.Errors, r.Misses, c.path, c.ops, c.bytes)
		}
		if (got.Populate != nil) != c.populated || r.LatencyNs.Count != 20 || r.LatencyNs.P50 <= 0 || r.LatencyNs.Max < r.LatencyNs.P999 {
			t.Errorf("%v: populate %+v, latency %+v", c.args, got.Populate, r.LatencyNs)
		}
		// A mixed run reports its gets' latency apart; other runs do not.
		if g := r.GetLatencyNs; (g != nil) != (got.Op == "mixed") || g != nil && (g.Count == 0 || g.Count > 20) {
			t.Errorf("%v: get latency %+v", c.args, g)
		}
	}
}

func TestBenchAgainstARealRedisServer(t *testing.T) {
	addr := startRedisServer(t)
	got := benchJSON(t, "--target", "redis://"+addr, "--op", "get", "--size", "256KiB", "--keys", "8", "--requests", "30", "-c", "4")
	if r := got.Run; got.Path != "resp" || got.Populate.Ops != 8 || r.Ops != 30 || r.Bytes != 30*256<<10 || r.Errors != 0 {
		t.Errorf("path %s, populate %+v, run %+v", got.Path, got.Populate, r)
	}
	got = benchJSON(t, "--target", "redis://"+addr, "--op", "put", "--size", "1KiB", "--requests", "30")
	if got.Run.Ops != 30 || got.Run.Errors != 0 {
		t.Errorf("puts: %+v", got.Run)
	}
}

func TestBenchCountsWrongBytesAsErrors(t *testing.T) {
	// A Redis-protocol server that forgets what it was told: every GET
	// answers 100 zero bytes.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
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
					args, err := readRESPCommand(r)
					if err != nil {
						return
					}
					switch args[0] {
					case "PING":
						io.WriteString(nc, "+PONG\r\n")
					case "SET":
						io.WriteString(nc, "+OK\r\n")
					case "GET":
						io.WriteString(nc, "$100\r\n"+strings.Repeat("\x00", 100)+"\r\n")
					}
				}
			}()
		}
	}()
	code, out, stderr := run(t, "bench", "--target", "redis://"+lis.Addr().String(), "--size", "100", "--keys", "4", "--requests", "10", "-c", "2")
	wantFailure(t, code, stderr, exitFailure, "bench: 10 errors (10 wrong values); first: key ")
	if !strings.Contains(out, "run: 10 errors, 10 of them wrong values; first: key ") {
		t.Errorf("the summary does not say what went wrong:\n%s", out)
	}
}

// readRESPCommand reads one command, a RESP2 array of bulk strings.
func readRESPCommand(r *bufio.Reader) ([]string, error) {
	var n int
	if _, err := fmt.Fscanf(r, "*%d\r\n", &n); err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		var size int
		if _, err := fmt.Fscanf(r, "$%d\r\n", &size); err != nil {
			return nil, err
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:size])
	}
	return args, nil
}

func TestBenchRefusesBadCommandLines(t *testing.T) {
	addr, _ := startNode(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--target", "redis://127.0.0.1:1", "--batch", "2"}, exitUsage, "--batch is 2: Redis targets take one key a request"},
		{[]string{"--target", "redis://127.0.0.1:1", "--op", "lookup", "--grpc"}, exitUsage, "--grpc is for kvstrata targets only; --op lookup is for kvstrata targets only"},
		{[]string{"--target", "memcached://x:1"}, exitUsage, `--target "memcached://x:1": want kvstrata://HOST:PORT or redis://HOST:PORT`},
		{[]string{"--duration", "1s", "--requests", "5"}, exitUsage, "--duration and --requests do not go together"},
		{[]string{"--op", "scan"}, exitUsage, `unknown op "scan"`},
		{[]string{"--get-ratio", "0.5"}, exitUsage, "--get-ratio is for --op mixed only"},
		{[]string{"--size", "huge"}, exitUsage, `--size: size "huge"`},
		{[]string{"--size", "2MiB", "--requests", "1"}, exitFailure, "bench: --size 2MiB is over the node's 1.0 MiB block limit"},
		{[]string{"--target", "redis://" + unusedAddr(t), "--requests", "1"}, exitFailure, "loadgen: open target 1 of 8: redis: dial"},
	} {
		code, _, stderr := run(t, append([]string{"--addr", addr, "bench"}, c.args...)...)
		wantFailure(t, code, stderr, c.code, c.msg)
	}
}

func TestBenchDrawsProgressOnlyOnATerminal(t *testing.T) {
	addr, _ := startNode(t)
	args := []string{"--addr", addr, "bench", "--op", "get", "--size", "1KiB", "--keys", "4", "--duration", "300ms"}
	code, _, stderr := runWith(t, session{outTerminal: true}, args...)
	if code != exitOK || !strings.Contains(stderr, "run ") || !strings.Contains(stderr, "requests") {
		t.Errorf("on a terminal: status %d, stderr %q", code, stderr)
	}
	code, _, stderr = run(t, args...)
	if code != exitOK || stderr != "" {
		t.Errorf("without a terminal: status %d, stderr %q", code, stderr)
	}
}

// startRedisServer starts redis-server on a free port, without
// persistence, and returns its address; it skips the test when none is
// installed.
func startRedisServer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed (apt-get install redis-server); skipping the test against a real Redis")
	}
	port := strconv.Itoa(unusedPort(t))
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", port)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := loadgen.DialRedis(context.Background(), addr, time.Second); err == nil {
			c.Close()
			return addr
		}
	}
	t.Fatalf("redis-server on %s did not answer PING within 5s", addr)
	return ""
}

func unusedPort(t *testing.T) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(unusedAddr(t))
	n, _ := strconv.Atoi(port)
	return n
}

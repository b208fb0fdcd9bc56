package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests of one Redis keyspace across a cluster: a key stored through
// any node's RESP port is found, replaced and deleted through every
// node's, with redis-cli as the client.

// answerBound is how long a command may take when a holder is dead or
// hung: the node's 10 s command timeout. The node gives up on one holder
// after 2 s, so an answer comes well before.
const answerBound = 10 * time.Second

// redisCLI runs redis-cli against p's RESP port with args (stdin, if not
// nil, as its input: for -x) and returns its output, trimmed, and whether
// the reply was an error. It fails the test if redis-cli takes longer
// than answerBound.
func redisCLI(t *testing.T, p *proc, stdin []byte, args ...string) (out string, isErr bool) {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	host, port, _ := net.SplitHostPort(p.resp)
	ctx, cancel := context.WithTimeout(context.Background(), answerBound+5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, append([]string{"-h", host, "-p", port}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if took := time.Since(start); took > answerBound {
		t.Fatalf("redis-cli %v took %v, over the %v command timeout: the node hung on a holder", args, took, answerBound)
	}
	out = strings.TrimSuffix(string(b), "\n")
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, b)
	}
	isErr = err != nil || strings.HasPrefix(out, "ERR") || strings.HasPrefix(out, "TRYAGAIN") || strings.HasPrefix(out, "(error)")
	return out, isErr
}

// mustCLI is redisCLI for a command that must not fail.
func mustCLI(t *testing.T, p *proc, args ...string) string {
	t.Helper()
	out, isErr := redisCLI(t, p, nil, args...)
	if isErr {
		t.Fatalf("redis-cli %v on %s: %s", args, p.resp, out)
	}
	return out
}

// getAnswers reads key through p: its value, or "" for a miss, or the
// error reply; it fails the test on an answer other than want, a miss or
// (with tryAgainOK) TRYAGAIN.
func getAnswers(t *testing.T, p *proc, key, want string, tryAgainOK bool) string {
	t.Helper()
	out, isErr := redisCLI(t, p, nil, "GET", key)
	switch {
	case isErr && tryAgainOK && strings.Contains(out, "TRYAGAIN"):
		return out
	case isErr:
		t.Fatalf("GET %s through %s: error %q", key, p.resp, out)
	case out != "" && out != want:
		t.Fatalf("GET %s through %s returned %d bytes %.40q…, want %.40q… or a miss", key, p.resp, len(out), out, want)
	}
	return out
}

func TestKeyspaceIsOneAcrossTheCluster(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	nodes := startCluster(t, loopback(3))
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	// Stored through node 1, found through 2 and 3 once the directory
	// lists node 1's block (it publishes its changes within milliseconds).
	mustCLI(t, n1, "SET", "prompt:1", "first value")
	for _, p := range []*proc{n2, n3} {
		eventually(t, 10*time.Second, "GET through another node finds the value", func() bool {
			return getAnswers(t, p, "prompt:1", "first value", false) == "first value"
		})
		if got := mustCLI(t, p, "EXISTS", "prompt:1", "prompt:none"); got != "1" {
			t.Fatalf("EXISTS through %s = %s, want 1", p.resp, got)
		}
	}
	if got := mustCLI(t, n1, "GET", "prompt:1"); got != "first value" {
		t.Fatalf("GET through node 1 = %q", got)
	}

	// A value of several gRPC chunks (1 MiB each) comes back whole.
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16+5)
	if out, isErr := redisCLI(t, n2, big, "-x", "SET", "prompt:big"); isErr || out != "OK" {
		t.Fatalf("SET prompt:big: %s", out)
	}
	eventually(t, 10*time.Second, "GET of a 3 MiB value through another node", func() bool {
		return getAnswers(t, n3, "prompt:big", string(big), false) == string(big)
	})

	// Replaced through node 2: no node answers the old value again.
	mustCLI(t, n2, "SET", "prompt:1", "second value")
	for _, p := range []*proc{n1, n3, n2} {
		eventually(t, 10*time.Second, "every node answers the new value", func() bool {
			return getAnswers(t, p, "prompt:1", "second value", false) == "second value"
		})
	}
	if got := mustCLI(t, n1, "GET", "prompt:1"); got != "second value" {
		t.Fatalf("GET through node 1 after the overwrite = %q", got)
	}

	// Deleted through node 3, which never held it: gone everywhere.
	if got := mustCLI(t, n3, "DEL", "prompt:1"); got != "1" {
		t.Fatalf("DEL through node 3 = %s, want 1", got)
	}
	for _, p := range nodes {
		if got := mustCLI(t, p, "GET", "prompt:1"); got != "" {
			t.Fatalf("GET through %s after DEL = %q, want a miss", p.resp, got)
		}
		if got := mustCLI(t, p, "EXISTS", "prompt:1"); got != "0" {
			t.Fatalf("EXISTS through %s after DEL = %s, want 0", p.resp, got)
		}
	}

	// A cluster-mode client given node 1 or node 2 sees one node owning
	// every slot and finds the other's keys through it.
	clusterModeClient(t, n1, n2)

	// A hung holder (SIGSTOP): the others answer within the command
	// timeout — TRYAGAIN or a miss — and the value again once it resumes.
	mustCLI(t, n1, "SET", "prompt:2", "held by node 1")
	eventually(t, 10*time.Second, "node 2 finds node 1's value", func() bool {
		return getAnswers(t, n2, "prompt:2", "held by node 1", false) == "held by node 1"
	})
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*proc{n2, n3} {
		getAnswers(t, p, "prompt:2", "held by node 1", true)
		if out, isErr := redisCLI(t, p, nil, "EXISTS", "prompt:2"); isErr && !strings.Contains(out, "TRYAGAIN") {
			t.Fatalf("EXISTS with node 1 hung: %s", out)
		}
	}
	if err := n1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "node 3 finds node 1's value once node 1 resumes", func() bool {
		return getAnswers(t, n3, "prompt:2", "held by node 1", true) == "held by node 1"
	})

	// A dead holder (kill -9): a miss or TRYAGAIN, within the bound, never
	// other bytes.
	n1.kill()
	for range 3 {
		for _, p := range []*proc{n2, n3} {
			getAnswers(t, p, "prompt:2", "held by node 1", true)
		}
	}
	// The keys the survivors hold are still served across them.
	if got := mustCLI(t, n3, "GET", "prompt:big"); got != string(big) {
		t.Fatalf("GET prompt:big (node 2's) through node 3 after node 1 died: %d bytes", len(got))
	}
}

// redisPyCluster is the script clusterModeClient runs: redis-py's
// RedisCluster on each of two nodes, writing through one and reading,
// replacing and deleting through the other.
const redisPyCluster = `
import sys, time
from redis.cluster import RedisCluster
a = RedisCluster(host=sys.argv[1], port=int(sys.argv[2]))
b = RedisCluster(host=sys.argv[3], port=int(sys.argv[4]))
assert len(a.get_nodes()) == 1 and len(b.get_nodes()) == 1, (a.get_nodes(), b.get_nodes())
def until(f, what):
    for _ in range(400):
        if f():
            return
        time.sleep(0.025)
    sys.exit("after 10 s: " + what)
a.set("cluster:1", b"\x00kv\xff")
until(lambda: b.get("cluster:1") == b"\x00kv\xff", "node 2 finds node 1's key")
assert b.exists("cluster:1") == 1
b.set("cluster:1", b"replaced")
until(lambda: a.get("cluster:1") == b"replaced", "node 1 finds node 2's value")
assert a.delete("cluster:1") == 1
assert b.get("cluster:1") is None and a.get("cluster:1") is None
print("ok")
`

// clusterModeClient runs redisPyCluster against p and q, if a python3 with
// redis-py (Debian python3-redis) is installed.
func clusterModeClient(t *testing.T, p, q *proc) {
	t.Helper()
	var py string
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(c, "-c", "import redis.cluster").Run() == nil {
			py = c
			break
		}
	}
	if py == "" {
		t.Log("no python3 with redis-py (Debian python3-redis): the cluster-mode client is not tried")
		return
	}
	ph, pp, _ := net.SplitHostPort(p.resp)
	qh, qp, _ := net.SplitHostPort(q.resp)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", redisPyCluster, ph, pp, qh, qp).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("redis-py RedisCluster: %v\n%s", err, out)
	}
}

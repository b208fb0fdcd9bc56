package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests of the commands that walk the whole keyspace — SCAN, KEYS,
// DBSIZE, FLUSHALL — across a cluster, with redis-cli as the client.

// lines splits redis-cli's output into sorted lines, none for "".
func lines(out string) []string {
	if out == "" {
		return nil
	}
	l := strings.Split(out, "\n")
	slices.Sort(l)
	return l
}

// scanDel runs `redis-cli --scan --pattern pattern | xargs redis-cli DEL`
// against p, as an operations guide says to.
func scanDel(t *testing.T, p *proc, pattern string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(p.resp)
	cli := fmt.Sprintf("redis-cli -h %s -p %s", host, port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sh := fmt.Sprintf("%s --scan --pattern '%s' | xargs %s DEL", cli, pattern, cli)
	if out, err := exec.CommandContext(ctx, "sh", "-c", sh).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", sh, err, out)
	}
}

func TestKeyspaceScanIsOneAcrossTheCluster(t *testing.T) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	nodes := startCluster(t, loopback(3))
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]

	var want []string
	for i := range 5 {
		for _, s := range []struct {
			p      *proc
			prefix string
		}{{n1, "a"}, {n3, "b"}} {
			k := fmt.Sprintf("%s:%d", s.prefix, i)
			mustCLI(t, s.p, "SET", k, "v")
			want = append(want, k)
		}
	}
	mustCLI(t, n2, "SET", "c:0", "v")
	want = append(want, "c:0")
	slices.Sort(want)

	// Every node lists every key, whichever node it was set through.
	eventually(t, 10*time.Second, "redis-cli --scan through node 2 lists the keys of nodes 1 and 3", func() bool {
		return slices.Equal(lines(mustCLI(t, n2, "--scan")), want)
	})
	for _, p := range nodes {
		if got := lines(mustCLI(t, p, "--scan")); !slices.Equal(got, want) {
			t.Fatalf("redis-cli --scan through %s = %q, want %q", p.resp, got, want)
		}
		if got := lines(mustCLI(t, p, "KEYS", "*")); !slices.Equal(got, want) {
			t.Fatalf("KEYS * through %s = %q, want %q", p.resp, got, want)
		}
		if got := mustCLI(t, p, "DBSIZE"); got != fmt.Sprint(len(want)) {
			t.Fatalf("DBSIZE through %s = %s, want %d", p.resp, got, len(want))
		}
	}

	// SCAN … COUNT 2, each call through the next node: a cursor is good
	// on any node.
	var got []string
	cursor := "0"
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatal("SCAN did not end in 100 calls")
		}
		reply := strings.Split(mustCLI(t, nodes[i%3], "SCAN", cursor, "COUNT", "2"), "\n")
		cursor = reply[0]
		for _, k := range reply[1:] {
			if k != "" {
				got = append(got, k)
			}
		}
		if cursor == "0" {
			break
		}
	}
	if slices.Sort(got); !slices.Equal(got, want) {
		t.Fatalf("SCAN COUNT 2 through the nodes in turn = %q, want %q", got, want)
	}

	// --scan --pattern … | xargs DEL through one node empties the pattern
	// on every node.
	scanDel(t, n2, "a:*")
	for _, p := range nodes {
		if got := mustCLI(t, p, "KEYS", "a:*"); got != "" {
			t.Fatalf("KEYS a:* through %s after the DEL through node 2 = %q", p.resp, got)
		}
		if got := mustCLI(t, p, "GET", "a:0"); got != "" {
			t.Fatalf("GET a:0 through %s after the DEL = %q, want a miss", p.resp, got)
		}
		if got := mustCLI(t, p, "DBSIZE"); got != "6" {
			t.Fatalf("DBSIZE through %s after the DEL = %s, want 6", p.resp, got)
		}
	}

	// A hung member (SIGSTOP) is skipped after the peer timeout: SCAN
	// lists the others' keys within the command timeout.
	if err := n3.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	got = lines(mustCLI(t, n2, "--scan"))
	if err := n3.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"c:0"}) {
		t.Fatalf("redis-cli --scan through node 2 with node 3 hung = %q, want node 2's c:0", got)
	}

	// INCR through node 2 of a counter node 1 holds continues from node
	// 1's value, and the counter then lives on node 2 alone; GETDEL through
	// node 3 takes it from every node.
	mustCLI(t, n1, "SET", "counter", "41")
	eventually(t, 10*time.Second, "node 2 finds node 1's counter", func() bool {
		return getAnswers(t, n2, "counter", "41", false) == "41"
	})
	if got := mustCLI(t, n2, "INCR", "counter"); got != "42" {
		t.Fatalf("INCR through node 2 of node 1's counter = %s, want 42", got)
	}
	if got := mustCLI(t, n1, "APPEND", "counter", "0"); got != "3" {
		t.Fatalf("APPEND through node 1 = %s, want 3", got)
	}
	eventually(t, 10*time.Second, "node 3 finds the new value", func() bool {
		return getAnswers(t, n3, "counter", "420", false) == "420"
	})
	if got := mustCLI(t, n3, "GETDEL", "counter"); got != "420" {
		t.Fatalf("GETDEL through node 3 = %q, want 420", got)
	}
	for _, p := range nodes {
		if got := mustCLI(t, p, "EXISTS", "counter"); got != "0" {
			t.Fatalf("EXISTS counter through %s after GETDEL = %s", p.resp, got)
		}
	}

	// FLUSHALL through one node empties every node.
	if got := mustCLI(t, n1, "FLUSHALL"); got != "OK" {
		t.Fatalf("FLUSHALL through node 1 = %s", got)
	}
	for _, p := range nodes {
		if got := mustCLI(t, p, "DBSIZE"); got != "0" {
			t.Fatalf("DBSIZE through %s after FLUSHALL = %s, want 0", p.resp, got)
		}
		if got := mustCLI(t, p, "GET", "b:0"); got != "" {
			t.Fatalf("GET b:0 through %s after FLUSHALL = %q, want a miss", p.resp, got)
		}
	}
}

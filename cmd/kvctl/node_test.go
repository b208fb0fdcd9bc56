package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
)

// startNode serves a node in-process, as kvstrata serve would, on
// loopback: gRPC and the TCP data plane, an 8 MiB DRAM tier over an 8 MiB
// second arena labelled SSD, moving blocks between them inline (so tests
// see demotions at once), a 1 MiB block limit and batches of at most 8
// blocks and 4 MiB. It returns the gRPC address.
func startNode(t testing.TB) (addr string, n *node.Node) {
	t.Helper()
	return serveNode(t, 8<<20, node.Config{MaxBlockSize: 1 << 20, MaxBatchBlocks: 8, MaxBatchBytes: 4 << 20}, true)
}

// serveNode serves a node of two tiers of tierBytes each with the limits of
// cfg, moving blocks inline or in the background.
func serveNode(t testing.TB, tierBytes int64, cfg node.Config, inline bool) (addr string, n *node.Node) {
	t.Helper()
	srv := nodetest.Start(t, nodetest.Options{DRAMBytes: tierBytes, SSDBytes: tierBytes, Limits: cfg, Inline: inline})
	return srv.Addr, srv.Node
}

// putBlocks stores blocks of size bytes under keys ns/hash for each hash,
// one after another (so the first is the least recently used), straight
// through the client, and returns their keys.
func putBlocks(t *testing.T, addr string, ns index.NamespaceID, size int, hashes ...index.Hash) []index.Key {
	t.Helper()
	c, err := client.Dial(context.Background(), addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := make([]index.Key, len(hashes))
	for i, h := range hashes {
		keys[i] = index.Key{NS: ns, Hash: h}
		data := bytes.Repeat([]byte{byte(h)}, size)
		if err := c.Put(context.Background(), []client.Block{{Key: keys[i], Data: data}}); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// held reports which of keys the node holds, in some tier.
func held(t *testing.T, n *node.Node, keys ...index.Key) []bool {
	t.Helper()
	ex, err := n.Exists(keys)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// unusedAddr returns a loopback address nothing listens on.
func unusedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func TestAddrComesFromTheFlagThenTheEnvironment(t *testing.T) {
	addr, _ := startNode(t)
	code, out, stderr := runWith(t, session{env: map[string]string{"KVSTRATA_ADDR": addr}}, "stats")
	if code != exitOK || !strings.Contains(out, "GRPC      "+addr) {
		t.Fatalf("stats with KVSTRATA_ADDR=%s: status %d, stderr %q, output:\n%s", addr, code, stderr, out)
	}
	code, _, stderr = runWith(t, session{env: map[string]string{"KVSTRATA_ADDR": unusedAddr(t)}}, "--addr", addr, "stats")
	if code != exitOK {
		t.Fatalf("--addr does not win over KVSTRATA_ADDR: status %d, %s", code, stderr)
	}
	code, out, _ = run(t, "stats", "--help")
	if code != exitOK || !strings.Contains(out, `--addr string`) || !strings.Contains(out, "(default \"127.0.0.1:7070\")") {
		t.Fatalf("help does not show --addr's default:\n%s", out)
	}
}

func TestANodeThatDoesNotAnswerIsOneLineAndStatus1(t *testing.T) {
	addr := unusedAddr(t)
	for _, args := range [][]string{
		{"stats"},
		{"lookup", "--namespace", "00000000000000aa", "0000000000000001"},
		{"evict", "--all", "--yes"},
		{"bench", "--requests", "1"},
	} {
		code, _, stderr := run(t, append([]string{"--addr", addr, "--timeout", "10s"}, args...)...)
		wantFailure(t, code, stderr, exitFailure, "the node at "+addr+" does not answer: connection refused")
		if strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: stderr is not one line: %q", args, stderr)
		}
	}
}

func TestASilentNodeTimesOut(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks HTTP/2
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	start := time.Now()
	code, _, stderr := run(t, "--addr", lis.Addr().String(), "--timeout", "300ms", "stats")
	wantFailure(t, code, stderr, exitFailure, "the node at "+lis.Addr().String()+" did not answer within 300ms")
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a 300ms timeout took %v", took)
	}
}

func TestCommandsCheckTheirCommandLineBeforeConnecting(t *testing.T) {
	addr := unusedAddr(t) // a usage error must win over the unreachable node
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"evict"}, "evict needs a selector"},
		{[]string{"evict", "--key", "nope"}, `key "nope" is not NS/HASH`},
		{[]string{"evict", "--namespace", "12"}, `namespace "12" is not 16 hex digits (or 0x and up to 16, or redis`},
		{[]string{"evict", "--tier", "tape", "--yes"}, `unknown tier "tape" (want dram, ssd or s3)`},
		{[]string{"evict", "--bytes", "lots", "--yes"}, `--bytes: size "lots"`},
		{[]string{"lookup", "0000000000000001"}, "--namespace is required"},
		{[]string{"lookup", "--namespace", "redis"}, "no hashes"},
		{[]string{"put", "00000000000000aa/0000000000000001"}, "put takes KEY FILE pairs, got 1 arguments"},
		{[]string{"get"}, "no keys given"},
		{[]string{"stats", "extra"}, "stats takes no arguments"},
		{[]string{"--timeout", "0s", "stats"}, "--timeout is 0s, must be positive"},
	} {
		code, _, stderr := run(t, append([]string{"--addr", addr}, c.args...)...)
		wantFailure(t, code, stderr, exitUsage, c.msg)
	}
}

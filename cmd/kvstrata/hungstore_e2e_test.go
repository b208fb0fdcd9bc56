package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// respDo sends one command to a Redis-protocol server and returns the
// first line of its reply, without the CRLF.
func respDo(t *testing.T, addr string, args ...string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return strings.TrimSuffix(line, "\r\n")
}

// A node whose object store hangs (a paused process) answers the blocks it
// holds only there as out of reach — on the data plane, over gRPC and
// over the Redis protocol, each in its own way — well within the read
// deadline, and still answers a block it never held as a plain miss.
func TestAHungObjectStoreIsReportedAsUnreachableNotAsAMiss(t *testing.T) {
	srv := s3test.Start(t)
	p := startNode(t, t.TempDir(), append(s3Flags(srv), "--s3-probe-timeout", "250ms")...)
	c := p.client(client.Options{})
	keys := putBlocks(t, c, 9, 0, 4, 64<<10)
	if got := respDo(t, p.resp, "SET", "hung-key", "value"); got != "+OK" {
		t.Fatalf("SET: %s", got)
	}
	ctx := context.Background()
	for _, ns := range []index.NamespaceID{9, index.RESPNamespace} {
		for _, tier := range []string{"dram", "ssd"} {
			if _, err := c.Evict(ctx, &pb.EvictRequest{HasNamespace: true, Namespace: uint64(ns), Tier: tier, Demote: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s3 := st.Tiers[len(st.Tiers)-1]; s3.Blocks == 5 && s3.Detail["pending_bytes"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the blocks never all reached the object store: %v", st.Tiers)
		}
	}

	// Well within the s3 tier's 5s read deadline; the probe takes 250ms.
	const bound = 5 * time.Second
	srv.Pause()
	missing := index.Key{NS: 9, Hash: 999}
	for _, opts := range []client.Options{{}, {NoDataPlane: true}} {
		cl := p.client(opts)
		start := time.Now()
		res, err := cl.Get(ctx, append(keys, missing))
		took := time.Since(start)
		t.Logf("%s: get of 4 blocks held only in the hung store and 1 held nowhere: %v", cl.DataPlane(), took.Round(time.Millisecond))
		if err != nil || took >= bound {
			t.Fatalf("%s: get with the store hung: %v after %v, want answers within %v", cl.DataPlane(), err, took, bound)
		}
		for i, r := range res[:len(keys)] {
			if r.Found || !errors.Is(r.Err, client.ErrUnavailable) || errors.Is(r.Err, client.ErrNotFound) {
				t.Errorf("%s: block %d held in the hung store: found %v, err %v; want ErrUnavailable", cl.DataPlane(), i, r.Found, r.Err)
			}
		}
		if r := res[len(keys)]; r.Found || r.Err != nil {
			t.Errorf("%s: a block held nowhere: found %v, err %v; want a plain miss", cl.DataPlane(), r.Found, r.Err)
		}
	}
	cluster := client.NewClusterClient(c, client.Options{NoDataPlane: true})
	defer cluster.Close()
	res, err := cluster.Get(ctx, append(keys, missing))
	if err != nil {
		t.Fatalf("cluster get with the store hung: %v", err)
	}
	for i, r := range res[:len(keys)] {
		if r.Found || !errors.Is(r.Err, client.ErrUnavailable) {
			t.Errorf("cluster: block %d held in the hung store: found %v, err %v; want ErrUnavailable", i, r.Found, r.Err)
		}
	}
	if r := res[len(keys)]; r.Found || r.Err != nil {
		t.Errorf("cluster: a block held nowhere: found %v, err %v; want a plain miss", r.Found, r.Err)
	}
	if got := respDo(t, p.resp, "GET", "hung-key"); !strings.HasPrefix(got, "-TRYAGAIN ") {
		t.Errorf("RESP GET of a key held in the hung store: %s, want -TRYAGAIN", got)
	}
	if got := respDo(t, p.resp, "GET", "never-set"); got != "$-1" {
		t.Errorf("RESP GET of a key held nowhere: %s, want a null reply", got)
	}
	// A client that is not ours tells the two apart too.
	if cli, err := exec.LookPath("redis-cli"); err == nil {
		host, port, _ := net.SplitHostPort(p.resp)
		out, _ := exec.Command(cli, "-h", host, "-p", port, "GET", "hung-key").CombinedOutput()
		if !strings.Contains(string(out), "TRYAGAIN") {
			t.Errorf("redis-cli GET of a key held in the hung store: %q, want TRYAGAIN", out)
		}
		out, _ = exec.Command(cli, "-h", host, "-p", port, "GET", "never-set").CombinedOutput()
		if strings.TrimSpace(string(out)) != "" {
			t.Errorf("redis-cli GET of a key held nowhere: %q, want a nil reply (an empty line)", out)
		}
	} else {
		t.Log("redis-cli not installed (Debian package redis-tools): checked with our own RESP client only")
	}
	resp, err := http.Get("http://" + p.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `kvstrata_tier_unreachable_total{tier="s3"} `) ||
		strings.Contains(string(body), `kvstrata_tier_unreachable_total{tier="s3"} 0`) {
		t.Errorf("metrics do not count the unreachable gets:\n%s", grepLines(string(body), "unreachable"))
	}

	srv.Resume()
	for deadline := time.Now().Add(15 * time.Second); !s3Available(t, c); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("s3 never became available after the store resumed")
		}
	}
	if n, _ := checkIntactOrMissing(t, c, keys, 64<<10); n != len(keys) {
		t.Fatalf("%d of %d blocks once the store resumed", n, len(keys))
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/connector/virtual"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// startDaemon runs a whole cache node in process, as kvstrata serve does,
// on loopback ports, and returns it once it is ready.
func startDaemon(t *testing.T) *daemon.Node {
	t.Helper()
	l, err := config.Load("", func(string) string { return "" }, map[string]string{
		"data-dir": t.TempDir(), "dram-capacity": "16MiB", "ssd-enabled": "false",
		"listen-grpc": "127.0.0.1:0", "listen-data": "127.0.0.1:0", "listen-resp": "", "listen-http": "127.0.0.1:0",
		"cluster-raft-addr": freeport.Addr(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	n, err := daemon.New(l.Config, daemon.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Stop(ctx)
	})
	for deadline := time.Now().Add(30 * time.Second); n.Ready() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the node is not ready after 30 s: %v", n.Ready())
		}
	}
	return n
}

// A planner's virtual connector writes its decisions into a real node's
// replicated state; kvctl shows and acknowledges them, the node's HTTP
// listener serves them, and the connector then reports the acked count.
func TestPlannerStatusAndAckOnARealNode(t *testing.T) {
	n := startDaemon(t)
	addr := n.Addrs().GRPC
	code, out, stderr := run(t, "--addr", addr, "planner", "status")
	if code != exitOK || !strings.Contains(out, "No planner decisions") {
		t.Fatalf("status of an empty cluster: %d %q %q", code, out, stderr)
	}

	ctx := context.Background()
	c, err := client.Dial(ctx, addr, client.Options{NoDataPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := virtual.New(virtual.NewCluster(c), virtual.Config{Initial: map[planner.Pool]int{planner.Decode: 1}})
	if err := conn.Scale(ctx, planner.Decode, 3); err != nil {
		t.Fatal(err)
	}
	if err := conn.Scale(ctx, planner.Decode, 2); !errors.Is(err, virtual.ErrAwaitingAck) {
		t.Fatalf("a change turning back before the ack: %v, want ErrAwaitingAck", err)
	}

	code, out, stderr = run(t, "--addr", addr, "-o", "json", "planner", "status")
	var got struct{ Decisions []plannerRow }
	if code != exitOK || json.Unmarshal([]byte(out), &got) != nil || len(got.Decisions) != 1 {
		t.Fatalf("status -o json: %d %q %q", code, out, stderr)
	}
	if d := got.Decisions[0]; d.Pool != "decode" || d.Seq != 1 || d.Current != 1 || d.Target != 3 || d.AckSeq != 0 || d.Mode != "active" {
		t.Fatalf("the decision as kvctl shows it: %+v", d)
	}
	code, out, _ = run(t, "--addr", addr, "planner", "status")
	if code != exitOK || !strings.Contains(out, "1 → 3") || !strings.Contains(out, "not yet") {
		t.Fatalf("status table:\n%s", out)
	}

	// The outside system runs 3 and says so.
	code, out, stderr = run(t, "--addr", addr, "planner", "ack", "decode", "1", "3")
	if code != exitOK || !strings.Contains(out, "Acknowledged decode decision #1: 3 running") {
		t.Fatalf("ack: %d %q %q", code, out, stderr)
	}
	reps, err := conn.Replicas(ctx)
	if err != nil || reps[planner.Decode] != (planner.Replicas{Desired: 3, Ready: 3}) {
		t.Fatalf("Replicas after the ack: %v %v, want decode 3/3", reps, err)
	}
	// An ack of a decision not made is refused, and changes nothing.
	code, _, stderr = run(t, "--addr", addr, "planner", "ack", "decode", "2", "5")
	wantFailure(t, code, stderr, exitFailure, "FailedPrecondition")

	// The node's HTTP listener serves the same record.
	resp, err := http.Get("http://" + n.Addrs().HTTP + "/v1/planner/decisions")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Decisions []struct {
			Pool        string `json:"pool"`
			Seq         uint64 `json:"seq"`
			AckSeq      uint64 `json:"ack_seq"`
			AckReplicas int64  `json:"ack_replicas"`
		} `json:"decisions"`
	}
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || len(body.Decisions) != 1 || body.Decisions[0].Pool != "decode" || body.Decisions[0].AckSeq != 1 || body.Decisions[0].AckReplicas != 3 {
		t.Fatalf("GET /v1/planner/decisions: %v %+v", err, body)
	}
	// The node's other HTTP endpoints are still there.
	if resp, err := http.Get("http://" + n.Addrs().HTTP + "/metrics"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// Bad input through the Store is refused before it reaches the node.
	if err := virtual.NewCluster(c).Put(ctx, []planner.Decision{{Seq: 2, Pool: "gpu", Target: 1}}); !errors.Is(err, virtual.ErrInvalid) {
		t.Fatalf("Put of an unknown pool: %v, want ErrInvalid", err)
	}
	if err := virtual.NewCluster(c).Put(ctx, []planner.Decision{{Seq: 1, Pool: planner.Decode, Target: 9}}); err != nil {
		t.Fatalf("a retried Put of the same seq: %v", err)
	}
	if err := virtual.NewCluster(c).Ack(ctx, planner.Decode, 1, 3); err != nil {
		t.Fatalf("an ack of the current decision again: %v", err)
	}

	// An advisory planner's published advice waits for no ack.
	advice := []planner.Decision{{Pool: planner.Prefill, Current: 1, Target: 2, Need: 1.5, Reason: "load", Mode: planner.ModeAdvisory}}
	if err := virtual.Publish(ctx, virtual.NewCluster(c), advice); err != nil {
		t.Fatal(err)
	}
	code, out, _ = run(t, "--addr", addr, "planner", "status")
	if code != exitOK || !regexp.MustCompile(`prefill +#1 +1 → 2 .*advisory .* advice`).MatchString(out) {
		t.Fatalf("status table with advice:\n%s", out)
	}
}

func TestPlannerAckRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"planner"}, "planner needs a command"},
		{[]string{"planner", "scale"}, `unknown planner command "scale"`},
		{[]string{"planner", "ack", "decode", "1"}, "ack takes POOL SEQ REPLICAS"},
		{[]string{"planner", "ack", "gpu", "1", "2"}, `pool "gpu"`},
		{[]string{"planner", "ack", "decode", "0", "2"}, `SEQ "0"`},
		{[]string{"planner", "ack", "decode", "one", "2"}, `SEQ "one"`},
		{[]string{"planner", "ack", "decode", "1", "--", "-2"}, `REPLICAS "-2"`},
		{[]string{"planner", "ack", "decode", "1", "-2"}, "unknown shorthand flag"},
	} {
		// No node listens at --addr: a usage error is found before dialling.
		code, _, stderr := run(t, append([]string{"--addr", "127.0.0.1:1"}, tc.args...)...)
		wantFailure(t, code, stderr, exitUsage, tc.want)
	}
}

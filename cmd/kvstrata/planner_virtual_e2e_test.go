package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
)

// End-to-end tests of `kvstrata planner --cache`: the decisions in a real
// cache node's replicated state, read and acknowledged with the real kvctl,
// as an outside system would.

var (
	kvctlOnce sync.Once
	kvctlBin  string
	kvctlErr  error
)

// kvctlBinary builds cmd/kvctl once, next to the kvstrata binary.
func kvctlBinary(t *testing.T) string {
	t.Helper()
	kvctlOnce.Do(func() {
		kvctlBin = filepath.Join(filepath.Dir(binary), "kvctl")
		if out, err := exec.Command("go", "build", "-race", "-o", kvctlBin, "../kvctl").CombinedOutput(); err != nil {
			kvctlErr = fmt.Errorf("building kvctl: %v\n%s", err, out)
		}
	})
	if kvctlErr != nil {
		t.Fatal(kvctlErr)
	}
	return kvctlBin
}

// kvctlDecision is a record as `kvctl planner status -o json` shows it.
type kvctlDecision struct {
	Pool        string  `json:"pool"`
	Seq         uint64  `json:"seq"`
	Current     int     `json:"current"`
	Target      int     `json:"target"`
	Need        float64 `json:"need"`
	Reason      string  `json:"reason"`
	Mode        string  `json:"mode"`
	Applied     bool    `json:"applied"`
	AckSeq      uint64  `json:"ack_seq"`
	AckReplicas int     `json:"ack_replicas"`
	Planner     string  `json:"planner"`
}

// kvctlPlanner runs kvctl planner ARGS against the node at addr.
func kvctlPlanner(t *testing.T, addr string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(kvctlBinary(t), append([]string{"--addr", addr, "-o", "json", "planner"}, args...)...).CombinedOutput()
	return string(out), err
}

// waitRecord polls kvctl planner status until pool's record satisfies cond.
func waitRecord(t *testing.T, node *proc, pl *proc, what string, cond func(kvctlDecision) bool) kvctlDecision {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last string
	for {
		out, err := kvctlPlanner(t, node.grpc, "status")
		last = out
		var st struct{ Decisions []kvctlDecision }
		if err == nil && json.Unmarshal([]byte(out), &st) == nil {
			for _, d := range st.Decisions {
				if d.Pool == string(planner.Aggregated) && cond(d) {
					return d
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s; kvctl planner status says %s (%v)\nthe planner's log:\n%s", what, last, err, pl.log)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestPlannerPublishesToTheCacheClusterAndTheVirtualConnectorWaitsForTheAck:
// an advisory planner with --cache publishes its advice into a real cache
// node's replicated state (kvctl planner status lists it, mode advisory,
// need > 0); an active planner with --connector virtual writes its scale-up
// there unacknowledged, kvctl planner ack acknowledges it with the
// replicas the outside system runs, and the planner's status then counts
// the pool at them.
func TestPlannerPublishesToTheCacheClusterAndTheVirtualConnectorWaitsForTheAck(t *testing.T) {
	kvctlBinary(t)
	node := startNode(t, t.TempDir())
	dir := t.TempDir()
	// A worker whose every prefill takes 500 ms: a few requests a second
	// need several workers for a 2 s TTFT.
	profile := filepath.Join(dir, "profile.json")
	os.WriteFile(profile, []byte(`{"version":1,"source":"test: slow prefill","prefill":{"poly":[500]},"decode":{"poly":[5.74,54.01,-25.74],"min_ms":1}}`), 0o644)
	w := startWorkerProcess(t, "", "--model", "sim")
	_, url := startFrontendProcess(t, "", []*wproc{w}, "--model", "sim")

	cl := frontendSDK(url)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if r := streamCompletion(cl, "kvstrata-sim", fmt.Sprintf("Client %d, request %d.", i, n), 4, nil); r.err != nil {
					t.Errorf("a request: %v", r.err)
					return
				}
			}
		})
	}
	common := []string{"planner", "--frontend", url, "--cache", node.grpc, "--profile", profile, "--interval", "1s",
		"--startup-delay", "1s", "--cooldown", "1s", "--pools", "aggregated:1-4", "--manual", "respect:1h"}

	// Advisory: the advice reaches the cluster, and nothing waits for an ack.
	adv := &proc{t: t, http: freeport.Addr(t)}
	adv.args = append(append([]string{}, common...), "--mode", "advisory", "--listen", adv.http)
	adv.start()
	advice := waitRecord(t, node, adv, "an advisory decision with a need > 0", func(d kvctlDecision) bool {
		return d.Mode == planner.ModeAdvisory && d.Need > 0
	})
	if advice.Applied || advice.AckSeq != 0 || advice.Seq == 0 || advice.Planner != "planner/none" {
		t.Errorf("the advice as kvctl shows it: %+v; want not applied, not acked, numbered, by planner/none", advice)
	}
	// The planner's own status speaks snake_case JSON.
	resp, err := http.Get("http://" + adv.http + "/v1/planner/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, key := range []string{`"observed_rate"`, `"decisions"`, `"need"`, `"pools"`, `"min"`} {
		if !strings.Contains(string(body), key) {
			t.Errorf("GET /v1/planner/status has no %s:\n%s", key, body)
		}
	}
	adv.stop()

	// Active through the virtual connector: the scale-up waits for its ack.
	act := &proc{t: t, http: freeport.Addr(t)}
	act.args = append(append([]string{}, common...), "--mode", "active", "--connector", "virtual", "--listen", act.http)
	act.start()
	up := waitRecord(t, node, act, "an unacknowledged scale-up", func(d kvctlDecision) bool {
		return d.Mode == planner.ModeActive && d.Target > d.Current && d.Seq > advice.Seq && d.AckSeq < d.Seq
	})
	if !up.Applied || up.Current != 1 || up.Target < 2 || up.Target > 4 || up.Planner != "planner" {
		t.Fatalf("the scale-up as kvctl shows it: %+v; want applied, from the minimum 1 to 2..4, by planner", up)
	}
	time.Sleep(2 * time.Second) // two more windows: the change still waits (a larger one may supersede it)
	again := waitRecord(t, node, act, "the change still waiting", func(kvctlDecision) bool { return true })
	if again.AckSeq != 0 || again.Seq < up.Seq || again.Target < up.Target {
		t.Fatalf("before the ack: %+v, want decision #%d, or a larger one after it, still unacknowledged", again, up.Seq)
	}
	up = again

	// The outside system could start one worker fewer than asked, and says so.
	runs := up.Target - 1
	out, err := kvctlPlanner(t, node.grpc, "ack", "aggregated", strconv.FormatUint(up.Seq, 10), strconv.Itoa(runs))
	if err != nil || !strings.Contains(out, fmt.Sprintf("Acknowledged aggregated decision #%d: %d running", up.Seq, runs)) {
		t.Fatalf("kvctl planner ack: %v\n%s", err, out)
	}
	waitRecord(t, node, act, "the ack recorded", func(d kvctlDecision) bool {
		return d.Seq == up.Seq && d.AckSeq == up.Seq && d.AckReplicas == runs
	})
	st := waitPlannerStatus(t, act, "the acknowledged replicas", func(s planner.Status) bool {
		return len(s.Decisions) == 1 && s.Decisions[0].Current == runs && s.Pools[planner.Aggregated].Current == runs
	})
	if d := st.Decisions[0]; d.Reason != planner.ReasonManual || d.Target != runs {
		t.Errorf("after the ack of %d for a target of %d: %+v; want the pool held at %d as a manual change", runs, up.Target, d, runs)
	}
	want := fmt.Sprintf("manual change of aggregated to %d observed (planner had %d)", runs, up.Target)
	if !strings.Contains(act.log.String(), want) {
		t.Errorf("the log does not say %q:\n%s", want, act.log)
	}
}

// TestPlannerCacheFlagErrors: --connector virtual without --cache is a
// usage error; a cache node that does not answer stops the planner at
// start with one line that names it.
func TestPlannerCacheFlagErrors(t *testing.T) {
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--mode", "active", "--connector", "virtual"},
		"--connector virtual needs --cache ADDR")
	dead := freeport.Addr(t)
	out, err := exec.Command(binary, "planner", "--frontend", "http://127.0.0.1:1", "--cache", dead, "--listen", freeport.Addr(t)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("a dead --cache: exit %v, want status 1:\n%s", err, out)
	}
	if want := "--cache " + dead + ": the cache node does not answer"; !strings.Contains(string(out), want) {
		t.Fatalf("a dead --cache: the output does not say %q:\n%s", want, out)
	}
}

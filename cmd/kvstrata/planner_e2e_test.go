package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
)

// End-to-end test of `kvstrata planner`: a sim worker and the frontend as
// processes, the planner in advisory mode reading the frontend's /metrics.

// plannerStatus reads GET /v1/planner/status.
func plannerStatus(t *testing.T, addr string) (planner.Status, error) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/v1/planner/status")
	if err != nil {
		return planner.Status{}, err
	}
	defer resp.Body.Close()
	var s planner.Status
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitPlannerStatus polls the status until cond holds.
func waitPlannerStatus(t *testing.T, pl *proc, what string, cond func(planner.Status) bool) planner.Status {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := plannerStatus(t, pl.http)
		if err == nil && cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s; last status %+v (%v)\n%s", what, s, err, pl.log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestPlannerAdvisesUnderLoadAndGoesToTheMinimumWhenIdle: under requests
// through the frontend the advisory planner's status shows a decision
// with a need > 0 and a pool above its minimum; when the traffic stops it
// drifts to the minimum (reason idle, need 0), its /metrics pass promtool
// and say so, and it never scaled anything.
func TestPlannerAdvisesUnderLoadAndGoesToTheMinimumWhenIdle(t *testing.T) {
	w := startWorkerProcess(t, "", "--model", "sim")
	_, url := startFrontendProcess(t, "", []*wproc{w}, "--model", "sim")
	pl := &proc{t: t, http: freeport.Addr(t)}
	pl.args = []string{"planner", "--frontend", url, "--mode", "advisory", "--interval", "1s", "--startup-delay", "1s",
		"--pools", "aggregated:0-4", "--slo-ttft", "2s", "--slo-itl", "50ms", "--listen", pl.http}
	pl.start()

	cl := frontendSDK(url)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				prompt := fmt.Sprintf("Client %d, request %d: a prompt about caches, tiers and planners.", i, n)
				if r := streamCompletion(cl, "kvstrata-sim", prompt, 16, nil); r.err != nil {
					t.Errorf("a request: %v", r.err)
					return
				}
			}
		})
	}
	busy := waitPlannerStatus(t, pl, "a decision with a need > 0", func(s planner.Status) bool {
		return len(s.Decisions) == 1 && s.Decisions[0].Need > 0 && s.Decisions[0].Target >= 1 && s.Predicted.ISL > 0
	})
	close(stop)
	wg.Wait()
	d := busy.Decisions[0]
	if d.Pool != planner.Aggregated || d.Mode != planner.ModeAdvisory || d.Applied || busy.ObservedRate <= 0 {
		t.Errorf("under load: %+v; want an advisory decision for the aggregated pool, not applied, a rate > 0", busy)
	}

	idle := waitPlannerStatus(t, pl, "the minimum after the traffic stopped", func(s planner.Status) bool {
		return len(s.Decisions) == 1 && s.Decisions[0].Target == 0 && s.Decisions[0].Reason == planner.ReasonIdle
	})
	if d := idle.Decisions[0]; d.Need != 0 || idle.IdleWindows < 2 || idle.Predicted.ISL != busy.Predicted.ISL && idle.Predicted.ISL <= 0 {
		t.Errorf("idle: %+v; want need 0 after 2 idle windows, the last ISL kept", idle)
	}

	resp, err := http.Get("http://" + pl.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`kvstrata_planner_desired_replicas{pool="aggregated"} 0`, `kvstrata_planner_need{pool="aggregated"} 0`,
		`kvstrata_planner_decisions_total{applied="false",direction="up",pool="aggregated"}`, `kvstrata_planner_predicted{series="isl"}`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics does not have %s:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), "NaN") {
		t.Errorf("/metrics has a NaN:\n%s", body)
	}
	promtoolCheckWorker(t, string(body))
	if strings.Contains(pl.log.String(), "scale aggregated") && !strings.Contains(pl.log.String(), "advisory: would scale aggregated 0→") {
		t.Errorf("the log does not give the advice:\n%s", pl.log)
	}
}

// TestPlannerBadFlagsAreUsageErrors: wrong flags exit 2 and say what is
// wrong, every problem at once.
func TestPlannerBadFlagsAreUsageErrors(t *testing.T) {
	usageErrorSays(t, []string{"planner", "--frontend", "ftp://x", "--pools", "aggregated:3", "--manual", "respect", "--connector", "k8s"},
		`--frontend "ftp://x": want http://host:port`, `"aggregated:3" is not POOL:MIN-MAX`, `--manual "respect": want respect:DURATION`,
		`--connector "k8s": want one of none`)
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--mode", "active", "--pools", "aggregated:3-1", "--slo-ttft", "0s"},
		"--connector none scales nothing", "limits 3-1", "TTFT target is 0s")
	usageErrorSays(t, []string{"planner", "--prometheus", "http://127.0.0.1:1", "--frontend", "http://127.0.0.1:2"}, "--frontend or --prometheus: give exactly one")
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--predictor", "oracle"}, `predictor "oracle" is unknown`)
	usageErrorSays(t, []string{"planner", "--frontend", "http://127.0.0.1:1", "--profile", "/nonexistent/profile.json"}, `--profile "/nonexistent/profile.json"`)
}

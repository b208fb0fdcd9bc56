package main

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

// steadyTrace is a request of 1,024 tokens every 2 s for 80 s, each with a
// prefix of its own, and 16 tokens out.
func steadyTrace() string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1024, "output_length": 16, "hash_ids": [%d, %d]}`+"\n", 2000*i, 2*i, 2*i+1)
	}
	return b.String()
}

type scalerRow struct {
	Scaler        string  `json:"scaler"`
	SLOAttainment float64 `json:"slo_attainment"`
	WorkerSeconds float64 `json:"worker_seconds"`
	WorkersMax    int     `json:"workers_max"`
	WorkersMean   float64 `json:"workers_mean"`
	DurationS     float64 `json:"duration_s"`
	Completed     int     `json:"completed"`
}

func scalerRows(t *testing.T, args ...string) ([]scalerRow, string) {
	t.Helper()
	path := writeTrace(t, steadyTrace())
	all := append([]string{"replay", path, "--router", "round-robin", "-o", "json", "--scale-interval", "10s", "--startup-delay", "5s"}, simulatedCluster...)
	code, out, stderr := run(t, append(all, args...)...)
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []scalerRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return rows, stderr
}

func TestReplaySimulateRunsEveryScalerOnce(t *testing.T) {
	rows, stderr := scalerRows(t, "--scaler", "static:3,static-peak,static-mean,reactive,planner")
	var got []string
	for _, r := range rows {
		got = append(got, r.Scaler)
		if r.Completed != 40 || !(r.WorkerSeconds > 0) || r.SLOAttainment < 0 || r.SLOAttainment > 1 {
			t.Errorf("%s: %d completed, %v worker-seconds, attainment %v", r.Scaler, r.Completed, r.WorkerSeconds, r.SLOAttainment)
		}
	}
	if want := "static:3 static-peak static-mean reactive planner"; strings.Join(got, " ") != want {
		t.Fatalf("rows %v, want one per --scaler, in order: %s", got, want)
	}
	if r := rows[0]; r.WorkersMax != 3 || math.Abs(r.WorkerSeconds-3*r.DurationS) > 1e-6 {
		t.Errorf("static:3: max %d workers, %v worker-seconds over %v s; want 3 all along", r.WorkersMax, r.WorkerSeconds, r.DurationS)
	}
	if !strings.Contains(stderr, "static sizing (planner/perf") {
		t.Errorf("-o json: stderr does not say how static-peak and static-mean were sized:\n%s", stderr)
	}
}

func TestReplaySimulateRaisesStaticPeakUntilItMeetsTheGoal(t *testing.T) {
	// No worker meets a 1 µs ITL: static-peak is raised up to the maximum.
	rows, stderr := scalerRows(t, "--scaler", "static-peak", "--slo-itl", "1us", "--max-workers", "3")
	if len(rows) == 0 || rows[len(rows)-1].WorkersMax != 3 {
		t.Fatalf("rows %+v, want static-peak raised to --max-workers 3", rows)
	}
	for i := 1; i < len(rows); i++ {
		if want := fmt.Sprintf("static-peak+%d", rows[i].WorkersMax-rows[0].WorkersMax); rows[i].Scaler != want || rows[i].WorkersMax != rows[i-1].WorkersMax+1 {
			t.Fatalf("rows %+v, want static-peak one worker larger each try, named for what was added", rows)
		}
	}
	if len(rows) < 2 || !strings.Contains(stderr, "under 99.00%; trying") {
		t.Errorf("stderr does not say static-peak was raised:\n%s", stderr)
	}
}

func TestReplaySimulateRefusesBadScalerFlags(t *testing.T) {
	good := writeTrace(t, steadyTrace())
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--scaler", "planner"}, "--scaler need --simulate"},
		{[]string{"--simulate", "--scaler", "static:0,fastest", "--slo-goal", "0", "--min-workers", "3", "--max-workers", "2", "--startup-delay", "-1s"},
			`--slo-goal is 0, must be in (0, 1]; --startup-delay is -1s, must be ≥ 0; --min-workers 3 and --max-workers 2 must satisfy 1 ≤ min ≤ max; ` +
				`--scaler: "static:0": static:N wants a worker count ≥ 1; --scaler: "fastest" is not a scaler`},
		{[]string{"--simulate", "--scaler", "planner", "--planner-profile", good + ".missing"}, "--planner-profile: "},
		{[]string{"--simulate", "--scaler", "planner", "--predictor", "tea-leaves"}, `--scaler planner: `},
	} {
		code, _, stderr := run(t, append([]string{"replay", good}, c.args...)...)
		wantFailure(t, code, stderr, exitUsage, c.msg)
	}
}

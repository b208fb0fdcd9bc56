package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/trace"
)

const conversationTrace = "../../testdata/traces/conversation_trace.jsonl"

func TestTraceRescalesToLoadSteps(t *testing.T) {
	out := filepath.Join(t.TempDir(), "steps.jsonl")
	code, stdout, stderr := run(t, "trace", conversationTrace, "-o", out, "--max-requests", "4000",
		"--curve", "steps:0.25@0,1@300,0.5@600,0.25@900", "--duration", "1200s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "wrote 4000 requests") {
		t.Errorf("stdout: %q", stdout)
	}
	in, _ := trace.ReadFile(conversationTrace)
	got, err := trace.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4000 {
		t.Fatalf("%d requests written, want 4000", len(got))
	}
	counts := make([]float64, 4)
	for i, r := range got {
		if i > 0 && r.Timestamp < got[i-1].Timestamp {
			t.Fatalf("request %d: timestamp %d before %d", i, r.Timestamp, got[i-1].Timestamp)
		}
		counts[min(r.Timestamp/300000, 3)]++
		// The conversation trace is sorted, so order is file order.
		if r.InputLength != in[i].InputLength || r.OutputLength != in[i].OutputLength || !slices.Equal(r.HashIDs, in[i].HashIDs) {
			t.Fatalf("request %d changed beyond its timestamp: %+v, was %+v", i, r, in[i])
		}
	}
	for i, share := range []float64{0.25, 1, 0.5, 0.25} {
		want := 4000 * share / 2
		if d := counts[i] - want; d > 0.05*want || d < -0.05*want {
			t.Errorf("step %d: %v arrivals, want %v ± 5 %%", i, counts[i], want)
		}
	}
}

func TestTraceMeanRPSSetsTheDuration(t *testing.T) {
	out := filepath.Join(t.TempDir(), "day.jsonl")
	code, stdout, stderr := run(t, "trace", conversationTrace, "-o", out, "--max-requests", "600", "--curve", "day:period=60", "--mean-rps", "2")
	if code != 0 || !strings.Contains(stdout, "over 5m0s (mean 2 requests/s)") {
		t.Fatalf("exit %d: %s%s", code, stdout, stderr)
	}
}

func TestTraceRejectsABadCommandLineAndWritesNothing(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"trace", conversationTrace, "-o", out, "--curve", "ramp:1", "--duration", "60s"}, "--curve: trace: bad rate curve"},
		{[]string{"trace", conversationTrace, "-o", out, "--curve", "day:period=60"}, "give either --duration or --mean-rps"},
		{[]string{"trace", conversationTrace, "-o", out, "--curve", "day:period=60", "--duration", "60s", "--mean-rps", "1"}, "give either --duration or --mean-rps"},
		{[]string{"trace", conversationTrace, "--curve", "day:period=60", "--duration", "10ms", "--max-requests", "-1"}, "-o OUT is required; --duration 10ms: want [100ms, 1000h]; --max-requests -1"},
		{[]string{"trace", conversationTrace, "-o", conversationTrace, "--curve", "day:period=60", "--duration", "60s"}, "is the input trace"},
		{[]string{"trace", "-o", out}, "one input TRACE file, got 0"},
	} {
		code, _, stderr := run(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", c.args, code, stderr, c.want)
		}
	}
	code, _, stderr := run(t, "trace", filepath.Join(dir, "missing.jsonl"), "-o", out, "--curve", "day:period=60", "--duration", "60s")
	if code != exitFailure || !strings.Contains(stderr, "missing.jsonl") {
		t.Errorf("a missing trace: exit %d, %q", code, stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad command lines left %v behind", entries)
	}
}

func TestPredictBacktestScoresEveryPredictor(t *testing.T) {
	code, stdout, stderr := run(t, "predict", "backtest", conversationTrace, "--window", "60s", "--predictors", "all", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rows []backtestRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rows {
		names = append(names, strings.SplitN(r.Predictor, ":", 2)[0])
		if r.Trace != "conversation_trace.jsonl" || r.Window != "1m0s" || r.N < 40 || !(r.MAE > 0) || r.RMSE < r.MAE {
			t.Errorf("row %+v", r)
		}
	}
	for _, k := range []string{"constant", "ma", "holt", "kalman", "holt-winters", "arima"} {
		if !slices.Contains(names, k) {
			t.Errorf("no %s row in %v", k, names)
		}
	}
	code, stdout, _ = run(t, "predict", "backtest", conversationTrace, "--window", "30s", "--predictors", "holt:0.3,0.05")
	if code != 0 || !strings.Contains(stdout, "holt:0.3,0.05") || !strings.Contains(stdout, "UNDER") {
		t.Errorf("a table with one predictor: exit %d\n%s", code, stdout)
	}
}

func TestPredictBacktestRejectsABadCommandLine(t *testing.T) {
	code, _, stderr := run(t, "predict", "backtest", conversationTrace, "--predictors", "holt:2,0", "--horizon", "0")
	if code != exitUsage || !strings.Contains(stderr, `--predictors: predict: bad predictor spec "holt:2,0": a is 2`) || !strings.Contains(stderr, "--horizon 0") {
		t.Errorf("exit %d, %q", code, stderr)
	}
	if code, _, stderr := run(t, "predict", "backtest"); code != exitUsage || !strings.Contains(stderr, "one or more TRACE") {
		t.Errorf("no trace: exit %d, %q", code, stderr)
	}
}

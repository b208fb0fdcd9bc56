package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// writeProfile writes the sim engine's default profile to a file.
func writeProfile(t *testing.T) string {
	t.Helper()
	b, err := sim.DefaultProfile().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "profile.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigureRecommendsARunnableDeployment(t *testing.T) {
	profile := writeProfile(t)
	up := filepath.Join(t.TempDir(), "up.sh")
	out, err := exec.Command(binary, "configure", "--profile", profile, "--budget", "4", "--isl", "4096", "--osl", "256",
		"--slo-ttft", "500ms", "--slo-itl", "30ms", "-o", "json", "--write-up", up).Output()
	if err != nil {
		t.Fatalf("configure: %v\n%s", err, out)
	}
	var rep configureReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rep.Front) == 0 || rep.Best == nil || rep.BestAggregated == nil || rep.Rejected == nil {
		t.Fatalf("front %v, best %v, best aggregated %v, rejected %v", rep.Front, rep.Best, rep.BestAggregated, rep.Rejected)
	}
	if rep.Rejected.ThroughputPerWorker >= rep.BestAggregated.ThroughputPerWorker {
		t.Errorf("the rejected configuration %+v outranks the best %+v", rep.Rejected, rep.BestAggregated)
	}
	// The script is the best configuration's `kvstrata up` line, and up
	// takes every flag of it.
	b, err := os.ReadFile(up)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(up); fi.Mode()&0o100 == 0 {
		t.Errorf("%s is not executable: %v", up, fi.Mode())
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "exec kvstrata up ") {
			line = l
		}
	}
	if line != "exec "+rep.Up+` "$@"` {
		t.Fatalf("up.sh runs %q, want the JSON's %q", line, rep.Up)
	}
	for _, cmdline := range []string{rep.Up, rep.UpAggregated, rep.UpRejected} {
		args := strings.Fields(strings.TrimPrefix(cmdline, "kvstrata up "))
		cmd := newUpCommand(io.Discard)
		if err := cmd.ParseFlags(args); err != nil {
			t.Errorf("up does not take %q: %v", cmdline, err)
			continue
		}
		if got, _ := cmd.Flags().GetString("sim-profile"); got != profile {
			t.Errorf("%q: --sim-profile %q, want %q", cmdline, got, profile)
		}
	}
	if !strings.Contains(rep.UpRejected, fmt.Sprintf("--max-num-seqs %d --max-num-batched-tokens %d", rep.Rejected.MaxNumSeqs, rep.Rejected.MaxNumBatchedTokens)) {
		t.Errorf("the rejected configuration's line %q has other limits than %+v", rep.UpRejected, rep.Rejected)
	}
}

func TestConfigurePrintsTheParetoFront(t *testing.T) {
	out, err := exec.Command(binary, "configure", "--profile", writeProfile(t), "--budget", "2", "--trace", "../../testdata/traces/synthetic_trace.jsonl",
		"--slo-ttft", "2s", "--slo-itl", "50ms").CombinedOutput()
	if err != nil {
		t.Fatalf("configure: %v\n%s", err, out)
	}
	for _, want := range []string{"TOK/S/WORKER", "TOK/S/USER", "← best", "best: aggregated 2", "kvstrata up --model sim", "rejected: aggregated 2"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the table does not say %q:\n%s", want, out)
		}
	}
}

func TestConfigureRejectsABadInput(t *testing.T) {
	profile := writeProfile(t)
	usageErrorSays(t, []string{"configure", "--profile", filepath.Join(t.TempDir(), "none.json"), "--budget", "0", "--isl", "100",
		"--slo-itl", "30ms", "--kv-tokens", "1000", "-o", "yaml"},
		"--slo-ttft is required", "--isl and --osl go together", `-o "yaml": want table or json`, "--kv-tokens 1000", "--profile:", "none.json")
	usageErrorSays(t, []string{"configure", "--profile", profile, "--budget", "300", "--isl", "100", "--osl", "10", "--hit", "1",
		"--slo-ttft", "1s", "--slo-itl", "30ms", "--max-num-seqs", "0"},
		"configure: bad input", "budget 300", "hit 1", "max_num_seqs 0")
	usageErrorSays(t, []string{"configure", "--profile", profile, "--budget", "2", "--slo-ttft", "1s", "--slo-itl", "1ms"},
		"give the load: --isl and --osl, or --trace")
	usageErrorSays(t, []string{"configure", "--profile", profile, "--budget", "2", "--slo-ttft", "soon"}, `invalid argument "soon"`)
	// Targets no deployment meets are not a usage error: exit 1, and why.
	out, err := exec.Command(binary, "configure", "--profile", profile, "--budget", "2", "--isl", "4096", "--osl", "100",
		"--slo-ttft", "1ms", "--slo-itl", "30ms").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no configuration of 2 workers meets TTFT 1ms") ||
		!strings.Contains(string(out), "ttft-infeasible") {
		t.Errorf("unreachable targets: %v\n%s", err, out)
	}
}

package main

import (
	"encoding/xml"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// The round trip of `kvstrata profile`: a sim worker replaying Dynamo's
// default profile is profiled, and the profile written gives back the
// default profile's times.

// profileSpeedup is the sim worker's speedup in the round trip. Below 1,
// it is a slowdown: each step is four times longer than the profile says,
// and the profiler scales the times back, so that what a loaded machine
// adds to each step (a timer firing late, a process scheduled late) is a
// quarter as large against the profile's time.
const profileSpeedup = "0.25"

// TestProfileRoundTripRecoversTheSimWorkersProfile profiles a real sim
// worker process and checks the fitted profile against the worker's own
// (sim.DefaultProfile): perf's prefill time and decode step at the swept
// points are within −10 % and +15 % of the truth on average, and each
// within −10 % and +30 %. The sim sleeps its steps, so measured times are
// never shorter than the profile's: the allowance below is for the fit,
// the one above for what a loaded machine adds to a step (a timer firing
// late, a process scheduled late), which a single point may catch more
// of than the median of five hides. Then the file reads with
// sim.ReadProfile, the SVG is XML with a point per measurement, and a
// worker starts with the profile written.
func TestProfileRoundTripRecoversTheSimWorkersProfile(t *testing.T) {
	// --token-bytes 4: the sim makes its blocks' KV bytes after each step's
	// sleep, and under -race making 64 bytes a token costs a fifth of a
	// prefill step; the bytes' size is no part of the profile.
	w := startWorkerProcess(t, "", "--speedup", profileSpeedup, "--num-gpu-blocks", "4096", "--token-bytes", "4")
	dir := t.TempDir()
	out, svg := filepath.Join(dir, "profile.json"), filepath.Join(dir, "profile.svg")
	cmd := exec.Command(binary, "profile", "--target", w.url, "--speedup", profileSpeedup,
		"--isl", "128,512,2048,4096", "--concurrency", "1,4,16", "--context", "1024,4096", "--output-tokens", "24", "--reps", "5",
		"-o", out, "--svg", svg)
	start := time.Now()
	text, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kvstrata profile: %v\n%s", err, text)
	}
	t.Logf("kvstrata profile took %v:\n%s", time.Since(start).Round(time.Millisecond), text)

	got, err := sim.ReadProfile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 2 || got.Worker == nil || got.Sweep == nil {
		t.Fatalf("profile version %d, worker %v, sweep %v: want version 2 with both", got.Version, got.Worker, got.Sweep)
	}
	// The pool's size came from the worker's vllm:cache_config_info.
	if got.Worker.KVTokens != 4096*16 || got.Worker.BlockTokens != 16 {
		t.Errorf("worker limits %+v, want the worker's 65536 KV tokens in blocks of 16", *got.Worker)
	}
	fitted, err := perf.FromProfile(got)
	if err != nil {
		t.Fatal(err)
	}
	truth, err := perf.New(sim.DefaultProfile(), *got.Worker)
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	var n int
	within := func(what string, f, tr time.Duration) {
		e := (f.Seconds() - tr.Seconds()) / tr.Seconds()
		sum, n = sum+e, n+1
		t.Logf("%s: fitted %.2f ms, true %.2f ms, %+.1f %%", what, profileMs(f), profileMs(tr), 100*e)
		if e < -0.10 || e > 0.30 {
			t.Errorf("%s: the fitted profile says %v, the worker's %v: %+.1f %%, outside −10 %%…+30 %%", what, f, tr, 100*e)
		}
	}
	if len(got.Sweep.Prefill) != 4 {
		t.Errorf("%d prefill points, want one per --isl", len(got.Sweep.Prefill))
	}
	for _, pt := range got.Sweep.Prefill {
		u := float64(pt.ISL)
		within("prefill of "+strconv.Itoa(pt.ISL)+" tokens", fitted.PrefillTime(u), truth.PrefillTime(u))
	}
	// 16 streams of 4096 tokens do not fit the 65536-token pool.
	if len(got.Sweep.Decode) != 5 {
		t.Errorf("%d decode points, want 3 concurrencies × 2 contexts less the one that does not fit", len(got.Sweep.Decode))
	}
	for _, pt := range got.Sweep.Decode {
		c, ctx := pt.Concurrency, float64(pt.Context)
		within("decode of "+strconv.Itoa(c)+" × "+strconv.Itoa(pt.Context), fitted.DecodeStep(c, ctx), truth.DecodeStep(c, ctx))
	}
	if mean := sum / float64(n); mean < -0.10 || mean > 0.15 {
		t.Errorf("the fitted profile's error is %+.1f %% on average over the %d points, outside −10 %%…+15 %%", 100*mean, n)
	}

	pic, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName xml.Name   `xml:"svg"`
		Circles []struct{} `xml:"circle"`
	}
	if err := xml.Unmarshal(pic, &doc); err != nil {
		t.Fatalf("the SVG is not XML: %v", err)
	}
	if len(doc.Circles) != len(got.Sweep.Prefill)+len(got.Sweep.Decode) {
		t.Errorf("the SVG has %d points, the sweep %d", len(doc.Circles), len(got.Sweep.Prefill)+len(got.Sweep.Decode))
	}

	// A worker replays the profile written.
	w2 := startWorkerProcess(t, "", "--sim-profile", out, "--speedup", "100")
	if body := scrapeWorker(t, w2.url); !strings.Contains(body, "vllm:cache_config_info") {
		t.Error("the worker started with the written profile exports no vllm:cache_config_info")
	}
}

func profileMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestProfileBadFlagsAndAnUnreachableTargetWriteNothing: bad flags and a
// target nothing listens on are usage errors, and no file is written.
func TestProfileBadFlagsAndAnUnreachableTargetWriteNothing(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "profile.json")
	usageErrorSays(t, []string{"profile", "-o", out},
		"--target is required")
	usageErrorSays(t, []string{"profile", "--target", "ftp://host", "--isl", "128,lots", "--concurrency", "0", "--speedup", "-1", "-o", out},
		`--isl "128,lots": "lots" is not an integer`)
	usageErrorSays(t, []string{"profile", "--target", "ftp://host", "--concurrency", "0", "--speedup", "-1", "--prompts", "emoji", "-o", out},
		`target "ftp://host" is not an http:// or https:// URL`, "concurrency has 0, each must be ≥ 1", "speedup is -1", `prompts is "emoji"`)
	usageErrorSays(t, []string{"profile", "--target", "http://127.0.0.1:1", "-o", filepath.Join(dir, "no", "such", "p.json")},
		"does not exist")
	usageErrorSays(t, []string{"profile", "--target", "http://" + freeport.Addr(t), "-o", out, "--svg", filepath.Join(dir, "p.svg")},
		"connection refused")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s was written by a profile that failed", e.Name())
	}
}

package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// simulateTrace is two conversations of two turns: the second turn of
// each repeats the first's prompt.
const simulateTrace = `{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 100, "input_length": 1024, "output_length": 4, "hash_ids": [3, 4]}
{"timestamp": 1000, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 5]}
{"timestamp": 1100, "input_length": 1536, "output_length": 4, "hash_ids": [3, 4, 6]}
`

// simulatedCluster keep the simulated cluster small, so the tests take little time.
var simulatedCluster = []string{"--simulate", "--workers", "2", "--pool-tokens", "16384", "--dram-tokens", "65536", "--ssd-tokens", "262144"}

func TestReplaySimulateWritesOneJSONRowPerPolicy(t *testing.T) {
	path := writeTrace(t, simulateTrace)
	args := append([]string{"replay", path, "--router", "kv-tiered,random", "-o", "json"}, simulatedCluster...)
	code, out, stderr := run(t, args...)
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(rows) != 2 || rows[0]["router"] != "kv-tiered" || rows[1]["router"] != "random" {
		t.Fatalf("rows %v, want kv-tiered then random, as --router lists them", rows)
	}
	for _, r := range rows {
		for _, field := range []string{"ttft_mean_s", "ttft_p99_s", "itl_mean_s", "e2e_mean_s"} {
			if v, ok := r[field].(float64); !ok || !(v > 0) {
				t.Errorf("%s: %s = %v, want a positive number of seconds", r["router"], field, r[field])
			}
		}
		tiers, ok := r["hit_tokens_by_tier"].(map[string]any)
		if !ok {
			t.Fatalf("%s: no hit_tokens_by_tier object in %v", r["router"], r)
		}
		for _, tier := range []string{"hbm", "dram", "ssd", "s3"} {
			if _, ok := tiers[tier].(float64); !ok {
				t.Errorf("%s: hit_tokens_by_tier has no %s: %v", r["router"], tier, tiers)
			}
		}
		if r["requests"] != 4.0 || r["completed"] != 4.0 {
			t.Errorf("%s: %v requests, %v completed; want 4 and 4", r["router"], r["requests"], r["completed"])
		}
	}

	// The same flags, the same rows but for the wall time.
	_, again, _ := run(t, args...)
	if strip(again) != strip(out) {
		t.Errorf("two runs differ:\n%s\n%s", out, again)
	}
}

// strip drops the wall_s fields of the JSON rows.
func strip(out string) string {
	var rows []map[string]any
	_ = json.Unmarshal([]byte(out), &rows)
	for _, r := range rows {
		delete(r, "wall_s")
	}
	b, _ := json.Marshal(rows)
	return string(b)
}

func TestReplaySimulatePrintsATable(t *testing.T) {
	path := writeTrace(t, simulateTrace)
	code, out, stderr := run(t, append([]string{"replay", path, "--parallel", "2"}, simulatedCluster...)...)
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	flat := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{"small.jsonl: 4 requests at speedup 1 on 2 simulated workers (pools of 16384 tokens)",
		"ROUTER CACHE TTFT MEAN TTFT P99 ITL MEAN E2E MEAN HIT HBM DRAM SSD S3 QUEUED FAILED",
		"random kvstrata ", "round-robin kvstrata ", "least-loaded kvstrata ", "kv-hbm kvstrata ", "kv-tiered kvstrata "} {
		if !strings.Contains(flat, want) {
			t.Errorf("the table does not say %q:\n%s", want, out)
		}
	}
}

func TestReplaySimulateRefusesBadFlagsAllAtOnce(t *testing.T) {
	good := writeTrace(t, simulateTrace)
	short := writeTrace(t, `{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [0]}`+"\n")
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{good, "--target", "http://127.0.0.1:1", "--workers", "4", "--router", "random"}, exitUsage,
			"--workers, --router need --simulate"},
		{[]string{good, "--simulate", "--target", "http://127.0.0.1:1"}, exitUsage, "--target and --simulate exclude each other"},
		{[]string{good, "--simulate", "--router", "kv-tiered,fastest", "--workers", "0", "--dram-gbps", "0", "--speedup", "-1"}, exitUsage,
			`--speedup is -1, must be > 0; --router: "fastest" is not a policy (want kv-tiered, kv-hbm, least-loaded, random, round-robin); --workers is 0, must be ≥ 1; --dram-gbps is 0, must be > 0`},
		{[]string{good, "--simulate", "--router", "random,random"}, exitUsage, "policy random is given twice"},
		{[]string{good, "--baseline", "random"}, exitUsage, "--baseline need --simulate"},
		{[]string{good, "--simulate", "--baseline", "kv-hbm,fastest,", "--workers", "0"}, exitUsage,
			`--baseline: "fastest" is not a policy (want kv-tiered, kv-hbm, least-loaded, random, round-robin); --baseline: "" is not a policy (want kv-tiered, kv-hbm, least-loaded, random, round-robin); --workers is 0, must be ≥ 1`},
		{[]string{good, "--simulate", "--baseline", "kv-hbm,kv-hbm", "--router", "kv-hbm,kv-hbm"}, exitUsage,
			"policy kv-hbm is given twice; baseline kv-hbm is given twice"},
		{[]string{good, "--simulate", "--cache-policy", "mru"}, exitUsage, `cache policy "mru" is not one of lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd`},
		{[]string{short, "--simulate"}, exitFailure, "request 1: replay: bad request in trace: input_length 2000 needs 4 hash ids"},
		{[]string{good + ".missing", "--simulate"}, exitFailure, "no such file"},
	} {
		code, _, stderr := run(t, append([]string{"replay"}, c.args...)...)
		wantFailure(t, code, stderr, c.code, c.msg)
	}
}

func TestReplaySimulateBaselinesAddRowsWithoutTheCache(t *testing.T) {
	path := writeTrace(t, simulateTrace)
	code, out, stderr := run(t, append([]string{"replay", path, "--router", "kv-tiered", "--baseline", "random,kv-hbm", "-o", "json"}, simulatedCluster...)...)
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []struct {
		Router string           `json:"router"`
		Cache  string           `json:"cache"`
		Hits   map[string]int64 `json:"hit_tokens_by_tier"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Router+"/"+r.Cache)
		if r.Cache == "none" && r.Hits["dram"]+r.Hits["ssd"]+r.Hits["s3"] != 0 {
			t.Errorf("%s without the cache restored tokens from the cache: %v", r.Router, r.Hits)
		}
	}
	if want := "kv-tiered/kvstrata random/none kv-hbm/none"; strings.Join(got, " ") != want {
		t.Fatalf("rows %v, want %s: --router's, then --baseline's", got, want)
	}

	// The table says which rows ran without the cache.
	_, table, _ := run(t, append([]string{"replay", path, "--router", "kv-tiered", "--baseline", "kv-hbm"}, simulatedCluster...)...)
	flat := strings.Join(strings.Fields(table), " ")
	for _, want := range []string{"kv-tiered kvstrata ", "kv-hbm none "} {
		if !strings.Contains(flat, want) {
			t.Errorf("the table does not say %q:\n%s", want, table)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// smallTrace has three requests of 4-token blocks: a two-block prompt,
// another prompt, then the first again, its last block partial (6 tokens).
const smallTrace = `{"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [3]}
{"timestamp": 2, "input_length": 6, "output_length": 1, "hash_ids": [1, 2]}
`

func writeTrace(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "small.jsonl")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimPrintsATableWithTheGapToBelady(t *testing.T) {
	path := writeTrace(t, smallTrace)
	code, out, stderr := run(t, "sim", path, "--block-tokens", "4", "-p", "lru,belady", "-c", "8,100")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "small.jsonl: 3 requests, 5 block references (3 distinct) of 4 tokens") {
		t.Errorf("summary line = %q", lines[0])
	}
	if got := strings.Fields(lines[2]); len(got) != 7 || got[0] != "POLICY" || got[5] != "TOKEN_GAP_TO_BELADY" {
		t.Errorf("header = %q", lines[2])
	}
	// In two blocks (8 tokens), block 3 evicts 1 under LRU, and request 3
	// misses; Belady evicts 2, used later than 1, and request 3 hits 1
	// block, 4 of 18 tokens. With room for all, request 3 hits both
	// blocks, 6 tokens (its input length), 2 of 5 blocks.
	want := []string{
		"lru 8 2 0.00% 0.00% 22.22 pp 20.00 pp",
		"lru 100 25 33.33% 40.00% 0.00 pp 0.00 pp",
		"belady 8 2 22.22% 20.00% 0.00 pp 0.00 pp",
		"belady 100 25 33.33% 40.00% 0.00 pp 0.00 pp",
	}
	if len(lines) != 3+len(want) {
		t.Fatalf("output has %d lines, want %d:\n%s", len(lines), 3+len(want), out)
	}
	for i, w := range want {
		if got := strings.Join(strings.Fields(lines[3+i]), " "); got != w {
			t.Errorf("row %d = %q, want %q", i, got, w)
		}
	}
}

func TestSimWithoutBeladyHasNoGapColumns(t *testing.T) {
	path := writeTrace(t, smallTrace)
	code, out, _ := run(t, "sim", path, "--block-tokens", "4", "--policy", "prefix", "--capacity-tokens", "100")
	if code != exitOK || strings.Contains(out, "BELADY") || !strings.Contains(out, "prefix") {
		t.Fatalf("status %d, output:\n%s", code, out)
	}
}

func TestSimJSONRows(t *testing.T) {
	path := writeTrace(t, smallTrace)
	for _, c := range []struct {
		policies string
		gaps     bool
	}{{"lru,lfu,prefix,belady", true}, {"lru,lfu", false}} {
		code, out, stderr := run(t, "sim", path, "--block-tokens", "4", "-p", c.policies, "-c", "8,1e2", "-o", "json")
		if code != exitOK {
			t.Fatalf("status %d: %s", code, stderr)
		}
		var rows []map[string]any
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("output is not a JSON array: %v\n%s", err, out)
		}
		if want := 2 * len(strings.Split(c.policies, ",")); len(rows) != want {
			t.Fatalf("%d rows, want %d", len(rows), want)
		}
		for _, r := range rows {
			for _, f := range []string{"policy", "capacity_tokens", "capacity_blocks", "token_hit_rate", "block_hit_rate"} {
				if _, ok := r[f]; !ok {
					t.Errorf("row %v lacks %q", r, f)
				}
			}
			if _, ok := r["token_gap_to_belady"]; ok != c.gaps {
				t.Errorf("row %v: gap present = %v, want %v", r, ok, c.gaps)
			}
		}
		if r := rows[1]; r["policy"] != "lru" || r["capacity_tokens"] != 100.0 || math.Abs(r["token_hit_rate"].(float64)-6.0/18) > 1e-12 {
			t.Errorf("second row = %v, want lru at 100 tokens hitting 6/18 of tokens", r)
		}
	}
}

func TestSimReproducesTheReferenceLRUHitRates(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "traces", "conversation_trace.jsonl")
	code, out, stderr := run(t, "sim", path, "-p", "lru", "-c", "1M,1e7", "-o", "json")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []simRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float64{0.054, 0.291} {
		if got := rows[i].TokenHitRate; math.Abs(got-want) > 0.0005 {
			t.Errorf("LRU at %d tokens: token hit rate %.4f, want %.3f", rows[i].CapacityTokens, got, want)
		}
	}
}

func TestSimRejectsABadCommandLine(t *testing.T) {
	path := writeTrace(t, smallTrace)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "sim takes one TRACE file, got 0 arguments"},
		{[]string{"sim", path, path}, "sim takes one TRACE file, got 2 arguments"},
		{[]string{"sim", path, "-p", "lru,mru"}, `unknown policy "mru" (want lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd, belady)`},
		{[]string{"sim", path, "-c", "0"}, `token count "0" is out of range`},
		{[]string{"sim", path, "-c", "-1e6"}, `token count "-1e6" is out of range`},
		{[]string{"sim", path, "-c", "lots"}, `token count "lots" is not a number (want a whole number like 1000000, 1e6 or 1M)`},
		{[]string{"sim", path, "-c", "1.5"}, `token count "1.5" is not a whole number`},
		{[]string{"sim", path, "-c", "100"}, "100 tokens hold no block of 512 tokens"},
		{[]string{"sim", path, "--block-tokens", "0"}, "--block-tokens is 0, must be in [1, 65536]"},
		{[]string{"sim", path, "--parallel", "-1"}, "--parallel is -1, must be ≥ 0"},
		{[]string{"sim", path, "--admit-by-frequency"}, "--admit-by-frequency needs --ssd-capacity-tokens (multi-tier mode)"},
		{[]string{"sim", path, "--ssd-capacity-tokens", "1e6", "--ssd-policy", "mru"}, `--ssd-policy "mru" is unknown (want one of lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd)`},
		{[]string{"sim", path, "--ssd-capacity-tokens", "1e6", "--admit-by-frequency", "--admit-min-seen", "2"}, "--admit-by-frequency and --admit-min-seen are two admission rules: give one"},
		{[]string{"sim", path, "--block-tokens", "x"}, `invalid argument "x" for "--block-tokens" flag`},
	} {
		code, _, stderr := run(t, c.args...)
		wantFailure(t, code, stderr, exitUsage, c.want)
	}
	// Every problem is named at once.
	code, _, stderr := run(t, "sim", path, "-p", "mru", "-c", "zero")
	wantFailure(t, code, stderr, exitUsage, `unknown policy "mru"`)
	if !strings.Contains(stderr, `token count "zero"`) {
		t.Errorf("stderr names only the first problem: %q", stderr)
	}
}

func TestSimFailsOnAMissingOrMalformedTrace(t *testing.T) {
	code, _, stderr := run(t, "sim", filepath.Join(t.TempDir(), "nope.jsonl"))
	wantFailure(t, code, stderr, exitFailure, "nope.jsonl: no such file or directory")

	bad := writeTrace(t, smallTrace+`{"timestamp": 3, "input_length": -4, "output_length": 1, "hash_ids": [1]}`+"\n")
	code, _, stderr = run(t, "sim", bad, "--block-tokens", "4", "-c", "8")
	wantFailure(t, code, stderr, exitFailure, "small.jsonl:4: input_length is -4, must be ≥ 0")
}

func TestSimDrawsProgressOnlyOnATerminal(t *testing.T) {
	path := writeTrace(t, smallTrace)
	var out, errOut bytes.Buffer
	a := &app{output: outputTable, stdout: &out, stderr: &errOut, interactive: func(io.Writer) bool { return true }}
	if code := a.execute(context.Background(), []string{"sim", path, "--block-tokens", "4", "-c", "8"}); code != exitOK {
		t.Fatalf("status %d: %s", code, errOut.String())
	}
	if !strings.Contains(errOut.String(), "replaying 11 caches") {
		t.Errorf("no progress on a terminal; stderr %q", errOut.String())
	}
	if strings.Contains(out.String(), "replaying") {
		t.Errorf("progress leaked into stdout:\n%s", out.String())
	}
	_, _, stderr := run(t, "sim", path, "--block-tokens", "4", "-c", "8")
	if stderr != "" {
		t.Errorf("progress drawn off a terminal: %q", stderr)
	}
}

func TestParseTokenCount(t *testing.T) {
	for in, want := range map[string]int64{
		"1000000": 1e6, "1e6": 1e6, "3e6": 3e6, "2.5e6": 2.5e6, "1E7": 1e7,
		"1M": 1e6, "1m": 1e6, "500k": 5e5, "2.5M": 2.5e6, "1G": 1e9, "1T": 1e12,
		" 512 ": 512, "0.5k": 500, "1_000_000": 1e6, "1e15": 1e15,
	} {
		if got, err := parseTokenCount(in); err != nil || got != want {
			t.Errorf("parseTokenCount(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-5", "1.5", "0.0005k", "1e16", "2000T", "inf", "NaN", "0x10", "1M5", "k", "1e"} {
		if got, err := parseTokenCount(in); err == nil {
			t.Errorf("parseTokenCount(%q) = %d, want an error", in, got)
		}
	}
}

func TestSimMultiTierReportsWhatEachTierServed(t *testing.T) {
	// A DRAM of one block over an SSD of two: request 3 finds block 1 in
	// the SSD (demoted when request 1's second block came in) and block 2
	// in DRAM... or the SSD; either way every hit is served by some tier.
	path := writeTrace(t, smallTrace)
	code, out, stderr := run(t, "sim", path, "--block-tokens", "4", "-p", "lru", "-c", "4",
		"--ssd-capacity-tokens", "8", "-o", "json")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []simRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].SSDCapacityTokens != 8 || len(rows[0].Tiers) != 2 {
		t.Fatalf("rows %+v", rows)
	}
	r := rows[0]
	if r.HitBlocks != 2 || r.Tiers[0].HitBlocks+r.Tiers[1].HitBlocks != 2 || r.Tiers[1].HitBlocks == 0 {
		t.Fatalf("hits %d, per tier %+v: want both blocks of request 3, some from the ssd", r.HitBlocks, r.Tiers)
	}
	code, _, stderr = run(t, "sim", path, "-c", "1e6", "--ssd-capacity-tokens", "1", "--admit-min-seen", "0")
	if code != exitUsage || !strings.Contains(stderr, "--ssd-capacity-tokens: 1 tokens hold no block") || !strings.Contains(stderr, "--admit-min-seen is 0") {
		t.Fatalf("bad multi-tier flags: status %d, %s", code, stderr)
	}
}

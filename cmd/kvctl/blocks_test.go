package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// randomFile writes size random bytes to dir/name and returns its path and
// bytes.
func randomFile(t *testing.T, dir, name string, size int) (string, []byte) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(size), 1))
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestPutAndGetRoundTripFilesWithChecksums(t *testing.T) {
	addr, _ := startNode(t)
	dir := t.TempDir()
	f1, d1 := randomFile(t, dir, "a.bin", 1<<20)
	f2, d2 := randomFile(t, dir, "b.bin", 12345)
	k1, k2 := nsA+"/0000000000000001", nsA+"/0000000000000002"
	sum1, sum2 := fmt.Sprintf("%016x", index.Checksum(d1)), fmt.Sprintf("%016x", index.Checksum(d2))

	code, out, stderr := run(t, "--addr", addr, "put", k1, f1, k2, f2)
	want := fmt.Sprintf("KEY  SIZE  CHECKSUM\n%s 1048576 %s\n%s 12345 %s\n", k1, sum1, k2, sum2)
	if code != exitOK || squeeze(out) != squeeze(want) {
		t.Fatalf("put: status %d, stderr %q, output:\n%s\nwant:\n%s", code, stderr, out, want)
	}

	// Into a directory, each block to NS-HASH.
	outDir := filepath.Join(dir, "blocks")
	code, out, stderr = run(t, "--addr", addr, "get", k1, k2, "-O", outDir)
	want = fmt.Sprintf("KEY SIZE CHECKSUM TIER\n%s 1048576 %s dram\n%s 12345 %s dram\n", k1, sum1, k2, sum2)
	if code != exitOK || squeeze(out) != squeeze(want) {
		t.Fatalf("get -O: status %d, stderr %q, output:\n%s\nwant:\n%s", code, stderr, out, want)
	}
	for name, data := range map[string][]byte{nsA + "-0000000000000001": d1, nsA + "-0000000000000002": d2} {
		if got, err := os.ReadFile(filepath.Join(outDir, name)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: %d bytes, %v; want the %d put", name, len(got), err, len(data))
		}
	}

	// One block to a file, as JSON.
	file := filepath.Join(dir, "one.bin")
	code, out, stderr = run(t, "--addr", addr, "get", k2, "--out", file, "-o", "json")
	var rows []blockRow
	if err := json.Unmarshal([]byte(out), &rows); code != exitOK || err != nil {
		t.Fatalf("get --out: status %d, %v, stderr %q, output:\n%s", code, err, stderr, out)
	}
	if got, _ := os.ReadFile(file); !bytes.Equal(got, d2) ||
		rows[0] != (blockRow{Key: k2, Found: true, Size: 12345, Checksum: sum2, Tier: "dram", File: file}) {
		t.Errorf("get --out wrote %d bytes, reported %+v", len(got), rows[0])
	}
}

func TestGetOfOneKeyWritesOnlyItsBytesToStdout(t *testing.T) {
	addr, _ := startNode(t)
	f, data := randomFile(t, t.TempDir(), "a.bin", 300<<10)
	key := nsB + "/00000000000000ff"
	if code, _, stderr := run(t, "--addr", addr, "put", key, f, "--parent", "00000000000000fe"); code != exitOK {
		t.Fatalf("put --parent: %s", stderr)
	}
	code, out, stderr := run(t, "--addr", addr, "get", key)
	if code != exitOK || out != string(data) {
		t.Fatalf("status %d, stdout of %d bytes (want the block's %d), stderr %q", code, len(out), len(data), stderr)
	}
	if !strings.HasPrefix(stderr, "KEY") || !strings.Contains(stderr, key) {
		t.Errorf("the table does not go to stderr: %q", stderr)
	}
}

func TestGetReportsMissingKeysAndFails(t *testing.T) {
	addr, _ := startNode(t)
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "a.bin", 100)
	have, missing := nsA+"/0000000000000001", nsA+"/0000000000000009"
	run(t, "--addr", addr, "put", have, f)
	code, out, stderr := run(t, "--addr", addr, "get", have, missing, "-O", dir)
	wantFailure(t, code, stderr, exitFailure, "get: 1 of 2 keys not found: "+missing)
	if !strings.Contains(squeeze(out), missing+" - - missing") || !strings.Contains(squeeze(out), have+" 100 ") {
		t.Errorf("output:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, nsA+"-0000000000000001")); err != nil {
		t.Errorf("the block found was not written: %v", err)
	}
}

func TestPutAndGetRefuseBadCommandLines(t *testing.T) {
	addr, _ := startNode(t)
	dir := t.TempDir()
	f, _ := randomFile(t, dir, "a.bin", 10)
	big, _ := randomFile(t, dir, "big.bin", 2<<20)
	k := nsA + "/0000000000000001"
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"put", k, f, k}, exitUsage, "put takes KEY FILE pairs, got 3 arguments"},
		{[]string{"put", k, f, k, f, "--parent", "0000000000000002"}, exitUsage, "--parent names the parent of one block, and 2 are given"},
		{[]string{"put", k, filepath.Join(dir, "nope")}, exitFailure, "no such file or directory"},
		{[]string{"put", k, big}, exitFailure, "block 0 is 2.0 MiB, over the node's 1.0 MiB limit"},
		{[]string{"get", k, k}, exitUsage, "stdout takes one block, and 2 keys are given: use -O DIR"},
		{[]string{"get", k, k, "--out", f}, exitUsage, "--out takes one block, and 2 keys are given"},
		{[]string{"get", k, "--out", f, "-O", dir}, exitUsage, "-O and --out do not go together"},
	} {
		code, _, stderr := run(t, append([]string{"--addr", addr}, c.args...)...)
		wantFailure(t, code, stderr, c.code, c.msg)
	}
	code, out, stderr := runWith(t, session{outTerminal: true}, "--addr", addr, "get", k)
	wantFailure(t, code, stderr, exitUsage, "refusing to write a block's bytes to the terminal")
	if out != "" {
		t.Errorf("wrote %q to the terminal", out)
	}
}

// squeeze collapses each run of spaces to one, for comparing tables.
func squeeze(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
)

func TestLookupPrintsThePrefixAndEachTiersLeadingBlocks(t *testing.T) {
	addr, _ := startNode(t)
	// A chain of ten 1 MiB blocks in an 8 MiB DRAM: the first four are
	// demoted to the SSD, the last six stay in DRAM.
	putBlocks(t, addr, 0xaa, 1<<20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	chain := []string{"0000000000000001", "0000000000000002", "0000000000000003", "0000000000000004",
		"0000000000000005", "0000000000000006", "00000000000000ff", "0000000000000007"}
	code, out, stderr := run(t, append([]string{"--addr", addr, "lookup", "--namespace", nsA}, chain...)...)
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	want := "Prefix: 6 of 8 blocks held.\n\nNODE  TIER  LEADING_BLOCKS\n1     ssd   4\n"
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}

	file := filepath.Join(t.TempDir(), "chain.txt")
	os.WriteFile(file, []byte("# the rest of the chain\n0000000000000006\n\n00000000000000ff\n"), 0o600)
	code, out, stderr = run(t, "--addr", addr, "lookup", "--namespace", nsA, "-o", "json",
		"0000000000000005", "--hashes-file", file)
	var got lookupOutput
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil {
		t.Fatalf("status %d, %v, stderr %q, output:\n%s", code, err, stderr, out)
	}
	if got.Namespace != nsA || got.Hashes != 3 || got.Blocks != 2 || len(got.Tiers) != 1 ||
		got.Tiers[0] != (tierBlocks{Node: 1, Tier: "dram", Blocks: 2}) {
		t.Errorf("got %+v", got)
	}
}

func TestLookupSaysWhenTheNodesDirectoryIsStale(t *testing.T) {
	stale := &pb.Freshness{LastContactMs: -1, AppliedIndex: 7, CommitIndex: 9, Reason: "cluster: no leader known"}
	var fresh atomic.Pointer[pb.Freshness]
	fresh.Store(stale)
	srv := nodetest.Start(t, nodetest.Options{Freshness: fresh.Load})
	code, out, stderr := run(t, "--addr", srv.Addr, "lookup", "--namespace", nsA, "0123456789abcdef")
	want := "Prefix: 0 of 1 block held.\nStale: this node's directory may be out of date (cluster: no leader known); ask another node.\n"
	if code != exitOK || out != want {
		t.Fatalf("status %d, stderr %q, output:\n%s\nwant:\n%s", code, stderr, out, want)
	}
	code, out, stderr = run(t, "--addr", srv.Addr, "lookup", "--namespace", nsA, "-o", "json", "0123456789abcdef")
	var got lookupOutput
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil {
		t.Fatalf("status %d, %v, stderr %q, output:\n%s", code, err, stderr, out)
	}
	if f := got.Freshness; f == nil || f.Current || f.LastContactMs != -1 || f.AppliedIndex != 7 || f.CommitIndex != 9 || f.Reason != stale.Reason {
		t.Errorf("JSON freshness %+v, want %v", f, stale)
	}

	fresh.Store(&pb.Freshness{Current: true, LeaderId: 1, AppliedIndex: 9, CommitIndex: 9}) // says nothing more
	code, out, _ = run(t, "--addr", srv.Addr, "lookup", "--namespace", nsA, "0123456789abcdef")
	if code != exitOK || out != "Prefix: 0 of 1 block held.\n" {
		t.Errorf("a current answer: status %d, output %q", code, out)
	}
}

func TestLookupOfAnUnknownChainHoldsNothing(t *testing.T) {
	addr, _ := startNode(t)
	code, out, stderr := run(t, "--addr", addr, "lookup", "--namespace", "redis", "0123456789abcdef")
	if code != exitOK || out != "Prefix: 0 of 1 block held.\n" {
		t.Fatalf("status %d, stderr %q, output %q", code, stderr, out)
	}
}

func TestLookupReportsBadHashesAndFiles(t *testing.T) {
	addr, _ := startNode(t)
	code, _, stderr := run(t, "--addr", addr, "lookup", "--namespace", nsA, "xyz", "12")
	wantFailure(t, code, stderr, exitUsage, `lookup: hash "xyz" is not 16 hex digits (or 0x and up to 16); hash "12" is not 16 hex digits (or 0x and up to 16)`)
	code, _, stderr = run(t, "--addr", addr, "lookup", "--namespace", nsA, "--hashes-file", "/nonexistent/chain.txt")
	wantFailure(t, code, stderr, exitFailure, "lookup: --hashes-file: open /nonexistent/chain.txt: no such file or directory")
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/index"
)

// evictNode starts a node holding four 64 KiB blocks of namespace aa (put
// in order, hashes 1 to 4) and two of namespace bb (hashes 1 and 2).
func evictNode(t *testing.T) (addr string, n *node.Node, a, b []index.Key) {
	t.Helper()
	addr, n = startNode(t)
	a = putBlocks(t, addr, 0xaa, 64<<10, 1, 2, 3, 4)
	b = putBlocks(t, addr, 0xbb, 64<<10, 1, 2)
	return addr, n, a, b
}

const nsA, nsB = "00000000000000aa", "00000000000000bb"

// tableKeys returns the keys in the KEY column of an output's table.
func tableKeys(out string) []string {
	var keys []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 4 && strings.Contains(f[0], "/") {
			keys = append(keys, f[0])
		}
	}
	return keys
}

func TestEvictByNamespaceRemovesOnlyIt(t *testing.T) {
	addr, n, a, b := evictNode(t)
	code, out, stderr := run(t, "--addr", addr, "evict", "--namespace", nsA, "--yes")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	if !strings.HasPrefix(out, "Evicted 4 blocks (256.0 KiB).\n\nKEY") {
		t.Errorf("output:\n%s", out)
	}
	want := []string{nsA + "/0000000000000001", nsA + "/0000000000000002", nsA + "/0000000000000003", nsA + "/0000000000000004"}
	if got := tableKeys(out); !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v (least recently used first)", got, want)
	}
	if !strings.Contains(out, nsA+"/0000000000000001  dram  64.0 KiB\n") {
		t.Errorf("rows are not KEY TIER SIZE:\n%s", out)
	}
	if h := held(t, n, append(a, b...)...); !slices.Equal(h, []bool{false, false, false, false, true, true}) {
		t.Errorf("held after the eviction: %v", h)
	}
}

func TestEvictDryRunOnlyReports(t *testing.T) {
	addr, n, a, _ := evictNode(t)
	code, out, stderr := run(t, "--addr", addr, "evict", "--namespace", nsA, "--dry-run", "--list", "1")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	if !strings.HasPrefix(out, "Would evict 4 blocks (256.0 KiB); dry run, nothing removed.\n") || !strings.HasSuffix(out, "… and 3 more\n") {
		t.Errorf("output:\n%s", out)
	}
	if h := held(t, n, a...); slices.Contains(h, false) {
		t.Errorf("a dry run removed blocks: %v", h)
	}
}

func TestBroadEvictionWithoutATerminalIsRefused(t *testing.T) {
	addr, n, a, _ := evictNode(t)
	code, out, stderr := run(t, "--addr", addr, "evict", "--namespace", nsA)
	wantFailure(t, code, stderr, exitUsage, "a broad eviction needs confirmation, and stdin is not a terminal: add --yes to evict, or --dry-run")
	if out != "" || slices.Contains(held(t, n, a...), false) {
		t.Errorf("a refused eviction wrote %q or removed blocks", out)
	}
}

func TestBroadEvictionAsksOnTheTerminal(t *testing.T) {
	addr, n, a, b := evictNode(t)
	code, out, stderr := runWith(t, session{terminal: true, stdin: "n\n"}, "--addr", addr, "evict", "--namespace", nsA)
	wantQuestion := "Evict 4 blocks (256.0 KiB)? [y/N] "
	if code != exitFailure || out != "" || !strings.Contains(stderr, "Would evict 4 blocks (256.0 KiB)") ||
		!strings.Contains(stderr, wantQuestion+"kvctl: evict: not confirmed; nothing was evicted\n") {
		t.Fatalf("answering n: status %d, stdout %q, stderr:\n%s", code, out, stderr)
	}
	if slices.Contains(held(t, n, a...), false) {
		t.Fatal("blocks evicted without a yes")
	}
	code, out, stderr = runWith(t, session{terminal: true, stdin: "yes\n"}, "--addr", addr, "evict", "--namespace", nsA)
	if code != exitOK || !strings.HasSuffix(stderr, wantQuestion) || !strings.HasPrefix(out, "Evicted 4 blocks (256.0 KiB).") {
		t.Fatalf("answering yes: status %d, stdout %q, stderr:\n%s", code, out, stderr)
	}
	if h := held(t, n, append(a, b...)...); !slices.Equal(h, []bool{false, false, false, false, true, true}) {
		t.Errorf("held after the eviction: %v", h)
	}
	code, out, stderr = runWith(t, session{terminal: true}, "--addr", addr, "evict", "--namespace", nsA)
	if code != exitOK || out != "Nothing matches: no blocks evicted.\n" || stderr != "" {
		t.Errorf("nothing to evict: status %d, stdout %q, stderr %q; want no question", code, out, stderr)
	}
}

func TestEvictByKeysNeedsNoConfirmation(t *testing.T) {
	addr, n, a, b := evictNode(t)
	code, out, stderr := run(t, "--addr", addr, "evict", "--key", a[1].String(), "--key", b[0].String())
	if code != exitOK || !strings.HasPrefix(out, "Evicted 2 blocks (128.0 KiB).") {
		t.Fatalf("status %d, stdout %q, stderr %q", code, out, stderr)
	}
	file := filepath.Join(t.TempDir(), "keys.txt")
	os.WriteFile(file, []byte("# stale\n"+a[2].String()+"\n\n  "+a[3].String()+"  \n"), 0o600)
	code, out, stderr = run(t, "--addr", addr, "evict", "--keys-file", file, "-o", "json")
	var got evictOutput
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil || got.Blocks != 2 || len(got.Listed) != 2 {
		t.Fatalf("--keys-file: status %d, %v, stderr %q, output:\n%s", code, err, stderr, out)
	}
	if l := got.Listed[0]; l.Key != a[2].String() || l.Tier != "dram" || l.Size != 64<<10 || len(l.Checksum) != 16 {
		t.Errorf("listed %+v", l)
	}
	if h := held(t, n, append(a, b...)...); !slices.Equal(h, []bool{true, false, false, false, false, true}) {
		t.Errorf("held after the evictions: %v", h)
	}
	os.WriteFile(file, []byte(a[0].String()+"\n"+"aa/1\n"), 0o600)
	code, _, stderr = run(t, "--addr", addr, "evict", "--keys-file", file)
	wantFailure(t, code, stderr, exitFailure, file+`:2: key "aa/1": namespace "aa" is not 16 hex digits`)
}

func TestEvictByTierTakesOnlyThatTiersCopies(t *testing.T) {
	addr, n := startNode(t)
	putBlocks(t, addr, 0xcc, 1<<20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) // 4 demoted to the SSD
	code, out, stderr := run(t, "--addr", addr, "evict", "--tier", "ssd", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 4 blocks (4.0 MiB).") || strings.Contains(out, "dram") {
		t.Fatalf("status %d, stderr %q, output:\n%s", code, stderr, out)
	}
	st := n.Hierarchy().Stats()
	if st.Levels[0].Blocks != 6 || st.Levels[1].Blocks != 0 {
		t.Errorf("DRAM holds %d blocks and SSD %d, want 6 and 0", st.Levels[0].Blocks, st.Levels[1].Blocks)
	}
}

func TestEvictOlderThanTakesIdleBlocks(t *testing.T) {
	addr, n := startNode(t)
	old := putBlocks(t, addr, 0xaa, 1000, 1, 2)
	time.Sleep(time.Second) // the fresh block keeps 900ms of margin on a slow machine
	fresh := putBlocks(t, addr, 0xaa, 1000, 3)
	code, out, stderr := run(t, "--addr", addr, "evict", "--older-than", "900ms", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 2 blocks (2.0 KiB).") {
		t.Fatalf("status %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if h := held(t, n, append(old, fresh...)...); !slices.Equal(h, []bool{false, false, true}) {
		t.Errorf("held: %v", h)
	}
}

func TestEvictBytesTakesTheLeastRecentlyUsedFirst(t *testing.T) {
	addr, n, a, b := evictNode(t)
	_, _, _, _ = n.Get(a[0], nil) // now the most recent
	code, out, stderr := run(t, "--addr", addr, "evict", "--namespace", nsA, "--bytes", "100KiB", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 2 blocks (128.0 KiB).") {
		t.Fatalf("status %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if h := held(t, n, append(a, b...)...); !slices.Equal(h, []bool{true, false, false, true, true, true}) {
		t.Errorf("held: %v, want blocks 2 and 3 of aa gone", h)
	}
}

func TestEvictAllEmptiesTheNode(t *testing.T) {
	addr, n, _, _ := evictNode(t)
	code, out, stderr := run(t, "--addr", addr, "evict", "--all", "--yes", "-o", "json")
	var got evictOutput
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil {
		t.Fatalf("status %d, %v, stderr %q, output:\n%s", code, err, stderr, out)
	}
	if got.DryRun || got.Blocks != 6 || got.Bytes != 6*64<<10 || len(got.Listed) != 6 || n.Hierarchy().Stats().Keys != 0 {
		t.Errorf("got %+v, node keeps %d blocks", got, n.Hierarchy().Stats().Keys)
	}
}

func TestEvictRedisNamespaceByName(t *testing.T) {
	addr, n := startNode(t)
	resp := putBlocks(t, addr, index.RESPNamespace, 100, 1)
	other := putBlocks(t, addr, 0xaa, 100, 1)
	code, out, stderr := run(t, "--addr", addr, "evict", "--namespace", "redis", "--yes")
	if code != exitOK || !strings.HasPrefix(out, "Evicted 1 block (100 B).") {
		t.Fatalf("status %d, stderr %q, output:\n%s", code, stderr, out)
	}
	if h := held(t, n, resp[0], other[0]); !slices.Equal(h, []bool{false, true}) {
		t.Errorf("held: %v", h)
	}
}

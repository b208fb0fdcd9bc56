package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/buildinfo"
)

// The conventions of the tools people already run: version and
// completion as every CLI has them, hashes as people write them, and the
// same member tiers in JSON as in the table.

func TestVersionPrintsTheBuildInfo(t *testing.T) {
	want := "kvctl " + buildinfo.Read().String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, stderr := run(t, args...)
		if code != exitOK || out != want {
			t.Errorf("kvctl %v: status %d, %q (stderr %q); want %q", args, code, out, stderr, want)
		}
	}
	code, out, stderr := run(t, "version", "-o", "json")
	var got buildinfo.Info
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil || got != buildinfo.Read() {
		t.Errorf("kvctl version -o json: status %d, %v, %+v (stderr %q); want %+v", code, err, got, stderr, buildinfo.Read())
	}
	code, _, stderr = run(t, "version", "now")
	wantFailure(t, code, stderr, exitUsage, `version takes no arguments, got ["now"]`)
}

// Each completion script loads in its shell without an error, and asks
// kvctl itself for candidates.
func TestCompletionScriptsLoad(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		code, script, stderr := run(t, "completion", shell)
		if code != exitOK || !strings.Contains(script, "__complete") {
			t.Fatalf("completion %s: status %d, stderr %q, script:\n%.300s", shell, code, stderr, script)
		}
		bin, err := exec.LookPath(shell)
		if err != nil {
			t.Logf("%s is not installed: its script is not loaded", shell)
			continue
		}
		file := filepath.Join(t.TempDir(), "kvctl."+shell)
		os.WriteFile(file, []byte(script), 0o600)
		load := map[string][]string{
			"bash": {"-c", `source "$0" && complete -p kvctl`, file},
			"zsh":  {"-c", `autoload -U compinit && compinit -u && source "$0"`, file},
			"fish": {"-c", `source $argv[1]; and functions -q __kvctl_prepare_completions`, file},
		}[shell]
		if out, err := exec.Command(bin, load...).CombinedOutput(); err != nil || strings.Contains(string(out), "error") {
			t.Errorf("%s cannot load kvctl's completion script: %v\n%s", shell, err, out)
		}
	}
	// What the scripts run: cobra's hidden __complete command.
	code, out, stderr := run(t, "__complete", "clu")
	if code != exitOK || !strings.Contains(out, "cluster\t") {
		t.Errorf("kvctl __complete clu: status %d, %q (stderr %q); want cluster", code, out, stderr)
	}
	code, _, stderr = run(t, "completion", "tcsh")
	wantFailure(t, code, stderr, exitUsage, `completion: unknown shell "tcsh" (want bash, zsh, fish)`)
	code, _, stderr = run(t, "completion")
	wantFailure(t, code, stderr, exitUsage, "completion takes one shell (bash, zsh, fish), got 0 arguments")
}

// Hashes and namespaces read the same written as kvctl prints them (16 hex
// digits) or as Go, C and Python print numbers (0x and up to 16).
func TestHashesTakeThe0xForm(t *testing.T) {
	addr, _ := startNode(t)
	putBlocks(t, addr, 0xaa, 4<<10, 1, 2, 3)
	for _, args := range [][]string{
		{"--namespace", nsA, "0000000000000001", "0000000000000002", "0000000000000003"},
		{"--namespace", "0xaa", "0x1", "0x0000000000000002", "0X3"},
	} {
		code, out, stderr := run(t, append([]string{"--addr", addr, "lookup"}, args...)...)
		if code != exitOK || !strings.HasPrefix(out, "Prefix: 3 of 3 blocks held.") {
			t.Errorf("lookup %v: status %d, stderr %q, output:\n%s", args, code, stderr, out)
		}
	}
	out := filepath.Join(t.TempDir(), "block")
	if code, _, stderr := run(t, "--addr", addr, "get", "0xaa/0x2", "--out", out); code != exitOK {
		t.Fatalf("get 0xaa/0x2: status %d, stderr %q", code, stderr)
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, bytes.Repeat([]byte{2}, 4<<10)) {
		t.Errorf("get 0xaa/0x2 wrote %d bytes, not block 2", len(b))
	}
	code, _, stderr := run(t, "--addr", addr, "lookup", "--namespace", nsA, "0x", "12345678901234567")
	wantFailure(t, code, stderr, exitUsage, `hash "0x" is not 16 hex digits (or 0x and up to 16); hash "12345678901234567" is not 16 hex digits`)
}

// kvctl cluster members -o json says of each member's tiers what the table
// says, and nothing the member record does not hold: no policy, hits or
// availability made up from zero values.
func TestClusterMembersJSONAgreesWithTheTable(t *testing.T) {
	addr := startDaemon(t).Addrs().GRPC // DRAM only
	putBlocks(t, addr, 0xaa, 256<<10, 1, 2, 3, 4)
	c, err := client.Dial(context.Background(), addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The member record has the tiers as of the node's last heartbeat.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m, err := c.Members(context.Background())
		if err == nil && len(m.Members) == 1 && len(m.Members[0].Tiers) > 0 && m.Members[0].Tiers[0].Blocks == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member record does not list the 4 blocks after 20s: %v, %v", m, err)
		}
	}

	code, table, stderr := run(t, "--addr", addr, "cluster", "members")
	if code != exitOK {
		t.Fatalf("cluster members: status %d, stderr %q", code, stderr)
	}
	code, doc, stderr := run(t, "--addr", addr, "cluster", "members", "-o", "json")
	if code != exitOK {
		t.Fatalf("cluster members -o json: status %d, stderr %q", code, stderr)
	}
	var got struct {
		Members []struct {
			ID      uint32            `json:"id"`
			Tiers   []json.RawMessage `json:"tiers"`
			TiersAt *time.Time        `json:"tiers_at"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(doc), &got); err != nil || len(got.Members) != 1 {
		t.Fatalf("%v in:\n%s", err, doc)
	}
	m := got.Members[0]
	var inJSON []string
	for _, raw := range m.Tiers {
		var keys map[string]any
		json.Unmarshal(raw, &keys)
		if k := slices.Sorted(maps.Keys(keys)); !slices.Equal(k, []string{"blocks", "capacity_bytes", "tier", "used_bytes"}) {
			t.Errorf("a member's tier in JSON has keys %v, want tier, capacity_bytes, used_bytes, blocks: %s", k, raw)
		}
		var tier memberTier
		json.Unmarshal(raw, &tier)
		inJSON = append(inJSON, tier.Tier+" "+formatBytes(tier.UsedBytes)+"/"+formatBytes(tier.CapacityBytes))
		if tier.Tier == index.TierDRAM.String() && (tier.Blocks != 4 || tier.UsedBytes < 4*256<<10 || tier.CapacityBytes != 16<<20) {
			t.Errorf("DRAM in JSON: %+v, want its 4 blocks of 256 KiB in 16 MiB", tier)
		}
	}
	if len(inJSON) != 1 || m.TiersAt == nil || time.Since(*m.TiersAt) > time.Hour {
		t.Errorf("member in JSON: %d tiers, reported at %v; want DRAM, reported just now:\n%s", len(inJSON), m.TiersAt, doc)
	}
	// The table's TIERS column, e.g. "dram 1.0 MiB/16.0 MiB, ssd 0 B/64.0 MiB".
	row := regexp.MustCompile(`(?m)^1 .*$`).FindString(table)
	if want := strings.Join(inJSON, ", "); row == "" || !strings.HasSuffix(row, want) {
		t.Errorf("the table's row\n%q\ndoes not end with the tiers of the JSON, %q; table:\n%s", row, want, table)
	}
}

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/freeport"
)

// The conventions other tools expect of a gRPC server and a daemon, driven
// by those tools: grpc-health-probe and grpcurl (neither written by us),
// JSON logs a log pipeline can read, and the version from the build info.

// goInstalledTool finds a command installed with go install: in PATH, else in
// $(go env GOPATH)/bin. It skips the test when neither has it; CI installs
// it (.ci/run).
func goInstalledTool(t *testing.T, name, module string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", name)
			if _, err := exec.LookPath(p); err == nil {
				return p
			}
		}
	}
	t.Skipf("%s is not installed (go install %s)", name, module)
	return ""
}

// grpcHealthProbe's exit statuses (its documented interface).
const (
	probeServing        = 0
	probeRPCFailure     = 3 // NotFound for a service the server does not know
	probeNotServing     = 4
	probeConnectionFail = 2
)

// healthProbe runs grpc-health-probe against addr for service and returns its
// exit status and output.
func healthProbe(t *testing.T, bin, addr, service string) (int, string) {
	t.Helper()
	out, err := exec.Command(bin, "-addr", addr, "-service", service, "-connect-timeout", "5s", "-rpc-timeout", "5s").CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("grpc-health-probe: %v", err)
	return 0, ""
}

// grpc-health-probe asks the node about each of its services by name, as
// Kubernetes' gRPC probes do: NOT_SERVING while the node is not ready (here:
// the first node of a two-node cluster, without a quorum until the second
// starts), SERVING once it is, and an unknown service is an error.
func TestGRPCHealthProbeAsksEachServiceByName(t *testing.T) {
	bin := goInstalledTool(t, "grpc-health-probe", "github.com/grpc-ecosystem/grpc-health-probe@v0.4.62")
	services := []string{"", "kvstrata.v1.Cache", "kvstrata.v1.Cluster"}
	raft := []string{freeport.Addr(t), freeport.Addr(t)}
	nodes := make([]*proc, 2)
	for i := range nodes {
		p := &proc{t: t, dir: t.TempDir(), grpc: freeport.Addr(t), resp: freeport.Addr(t), http: freeport.Addr(t)}
		p.args = []string{"serve", "--node-id", strconv.Itoa(i + 1), "--data-dir", p.dir, "--dram-capacity", "16MiB",
			"--ssd-capacity", "64MiB", "--listen-grpc", p.grpc, "--listen-data", freeport.Addr(t), "--listen-resp", p.resp,
			"--listen-http", p.http, "--cluster-raft-addr", raft[i], "--cluster-bootstrap", "1=" + raft[0] + ",2=" + raft[1]}
		nodes[i] = p
	}
	first := nodes[0]
	first.launch()
	// Alone, node 1 has no leader: its directory is not current, so no
	// service of it is ready.
	eventually(t, 20*time.Second, "grpc-health-probe reaches node 1", func() bool {
		code, _ := healthProbe(t, bin, first.grpc, "kvstrata.v1.Cache")
		return code != probeConnectionFail
	})
	for _, s := range services {
		if code, out := healthProbe(t, bin, first.grpc, s); code != probeNotServing {
			t.Errorf("grpc-health-probe -service %q of a node without quorum: exit %d, want %d (NOT_SERVING): %s", s, code, probeNotServing, out)
		}
	}
	nodes[1].launch()
	first.waitReady()
	for _, s := range services {
		var code int
		var out string
		eventually(t, 20*time.Second, fmt.Sprintf("grpc-health-probe -service %q says SERVING", s), func() bool {
			code, out = healthProbe(t, bin, first.grpc, s)
			return code == probeServing
		})
		if !strings.Contains(out, "SERVING") {
			t.Errorf("grpc-health-probe -service %q: %s", s, out)
		}
	}
	if code, out := healthProbe(t, bin, first.grpc, "kvstrata.v1.NoSuchService"); code != probeRPCFailure || !strings.Contains(out, "NotFound") {
		t.Errorf("grpc-health-probe -service kvstrata.v1.NoSuchService: exit %d, want %d with NotFound: %s", code, probeRPCFailure, out)
	}
}

// The README's grpcurl example works as written: the gRPC JSON mapping
// writes a fixed64 in decimal, kvctl in hex, and printf converts between
// them (%u from 0xHEX, %016x back), for hashes over 2^63 too.
func TestGrpcurlFindsABlockByTheHashKvctlPrints(t *testing.T) {
	grpcurl := goInstalledTool(t, "grpcurl", "github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4")
	p := startNode(t, t.TempDir())
	ns := index.NamespaceID(0x9f86d081884c7d65)
	hash := index.Hash(0xfedcba9876543210)
	c := p.api()
	keys := putBlocks(t, c, ns, int(hash), int(hash)+1, 4096) // putBlocks names block i by hash i
	if keys[0].Hash != hash {
		t.Fatalf("put %v, want hash %v", keys[0], hash)
	}
	// The README snippet, with NS and HASH as kvctl prints them.
	script := `
grpcurl -plaintext -d "{\"namespace\": \"$(printf '%u' 0x$NS)\", \"hashes\": [\"$(printf '%u' 0x$HASH)\"]}" \
  "$ADDR" kvstrata.v1.Cache/Lookup
grpcurl -plaintext -d "{\"keys\": [{\"namespace\": \"$(printf '%u' 0x$NS)\", \"hash\": \"$(printf '%u' 0x$HASH)\"}]}" \
  "$ADDR" kvstrata.v1.Cache/Get | jq_hash
`
	// jq_hash: print the hash of Get's first message back in hex, as kvctl does.
	jqHash := `jq_hash() { sed -n 's/.*"hash": "\([0-9]*\)".*/\1/p' | head -1 | xargs printf '%016x\n'; }`
	cmd := exec.Command("bash", "-c", "set -eo pipefail; "+jqHash+"\n"+strings.ReplaceAll(script, "grpcurl ", grpcurl+" "))
	cmd.Env = append(cmd.Environ(), "NS="+ns.String(), "HASH="+hash.String(), "ADDR="+p.grpc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("grpcurl: %v\n%s", err, out)
	}
	var lookup struct {
		Blocks int `json:"blocks"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&lookup); err != nil || lookup.Blocks != 1 {
		t.Fatalf("Lookup through grpcurl: %+v, %v; want 1 block:\n%s", lookup, err, out)
	}
	rest, _ := io.ReadAll(dec.Buffered())
	if got := strings.TrimSpace(string(rest)); got != hash.String() {
		t.Errorf("Get through grpcurl gave back hash %q, want %s as kvctl prints it:\n%s", got, hash, out)
	}
}

// duplicateKeys returns the keys that appear twice in one object of the
// JSON document line, at any depth. encoding/json keeps the last of two
// and says nothing, so it walks the tokens.
func duplicateKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	var dups []string
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				if seen[key] {
					dups = append(dups, key)
				}
				seen[key] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // }
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ]
			return err
		}
		return nil
	}
	if err := walk(); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value on the line")
	}
	return dups, nil
}

func TestDuplicateKeysSeesEveryDepth(t *testing.T) {
	for line, want := range map[string]string{
		`{"a":1,"b":{"a":2}}`:            "",
		`{"a":1,"a":2}`:                  "a",
		`{"a":{"b":[{"c":1,"c":2}]}}`:    "c",
		`{"time":"x","raft":{"time":1}}`: "",
	} {
		dups, err := duplicateKeys([]byte(line))
		if err != nil || strings.Join(dups, ",") != want {
			t.Errorf("duplicateKeys(%s) = %v, %v; want %q", line, dups, err, want)
		}
	}
}

// Every line a cluster logs in JSON is one JSON object with no key twice,
// raft's lines included (raft names a key "time", as slog names the
// line's): a node is killed so that the leader logs raft's complaint,
// "failed to contact", which carries raft's time.
func TestJSONLogsHaveNoDuplicateKeys(t *testing.T) {
	nodes := startCluster(t, loopback(3), "--log-format", "json")
	nodes[2].kill()
	eventually(t, 30*time.Second, "the leader logs that it cannot contact the killed node", func() bool {
		return strings.Contains(nodes[0].log.String()+nodes[1].log.String(), `"msg":"raft: failed to contact"`)
	})
	nodes[0].stop()
	nodes[1].stop()
	lines := 0
	for i, p := range nodes {
		sc := bufio.NewScanner(strings.NewReader(p.log.String()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := bytes.TrimSpace(sc.Bytes())
			if len(line) == 0 {
				continue
			}
			lines++
			if line[0] != '{' {
				t.Errorf("node %d logged a line that is not JSON: %s", i+1, line)
				continue
			}
			dups, err := duplicateKeys(line)
			if err != nil || len(dups) > 0 {
				t.Errorf("node %d: keys %v twice (%v) in %s", i+1, dups, err, line)
			}
		}
	}
	if lines < 6 {
		t.Errorf("only %d log lines from three nodes", lines)
	}
}

// kvstrata --version and kvstrata version print the version, commit and
// commit time that the build info records (go version -m shows the same).
func TestVersionComesFromTheBuildInfo(t *testing.T) {
	run := func(args ...string) string {
		out, err := exec.Command(binary, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("kvstrata %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	line := run("version")
	if got := run("--version"); got != line {
		t.Errorf("kvstrata --version says %q, kvstrata version %q", got, line)
	}
	if !regexp.MustCompile(`^kvstrata \S+ \(.*go1\.[0-9.]+.*\)\n$`).MatchString(line) {
		t.Errorf("kvstrata version: %q, want kvstrata VERSION (…, goX.Y)", line)
	}
	recorded, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s+build\s+(vcs\.\w+)=(\S+)$`).FindAllStringSubmatch(string(recorded), -1) {
		settings[m[1]] = m[2]
	}
	if rev := settings["vcs.revision"]; rev != "" {
		if !strings.Contains(line, "commit "+rev[:12]) || !strings.Contains(line, settings["vcs.time"]) ||
			strings.Contains(line, "modified") != (settings["vcs.modified"] == "true") {
			t.Errorf("kvstrata version: %q; the build info records %v", line, settings)
		}
	} else if strings.Contains(line, "commit") {
		t.Errorf("kvstrata version names a commit the build info does not record: %q", line)
	}
	if out, err := exec.Command(binary, "version", "extra").CombinedOutput(); exitStatusOf(err) != exitUsage {
		t.Errorf("kvstrata version extra: %v, want exit %d:\n%s", err, exitUsage, out)
	}
	// The bash completion script loads in bash.
	if out, err := exec.Command("bash", "-c", `source <("$0" completion bash) && complete -p kvstrata`, binary).CombinedOutput(); err != nil {
		t.Errorf("bash cannot load kvstrata's completion script: %v\n%s", err, out)
	}
}

// exitStatusOf is the exit status err reports, 0 for nil.
func exitStatusOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

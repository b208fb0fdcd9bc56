// Package image checks the repository's Dockerfile as far as a machine
// without an image builder allows: its build command, run here, makes a
// static binary without cgo that accepts the image's configuration; where
// a builder answers (docker info), the image itself is built. The package
// is tests only, apart from cmd/kvstrata's so that its build runs beside
// theirs.
package image

import (
	"debug/buildinfo"
	"debug/elf"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, where the Dockerfile is.
const root = "../.."

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return int32(n)
}

// dockerfile reads a Dockerfile's instructions, continuation lines joined.
func dockerfile(t *testing.T) [][2]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		op, rest, _ := strings.Cut(line, " ")
		out = append(out, [2]string{strings.ToUpper(op), strings.TrimSpace(rest)})
	}
	return out
}

// The Dockerfile builds a static binary without cgo on the Go of go.mod,
// into a non-root final stage; its build command works here and makes a
// binary with no dynamic loader, that loads the image's configuration and
// listens on the ports the image exposes. The image itself is built where
// a builder answers.
func TestDockerfileBuildsAStaticNonRootImage(t *testing.T) {
	ins := dockerfile(t)
	var froms, builds []string
	var user, expose string
	env := map[string]string{}
	for _, in := range ins {
		switch in[0] {
		case "FROM":
			froms = append(froms, in[1])
		case "RUN":
			if strings.Contains(in[1], "go build") {
				builds = append(builds, in[1])
			}
		case "USER":
			user = in[1]
		case "EXPOSE":
			expose = in[1]
		case "ENV":
			for _, kv := range strings.Fields(in[1]) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		case "ARG":
			if v, ok := strings.CutPrefix(in[1], "GO_VERSION="); ok {
				gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
				if err != nil {
					t.Fatal(err)
				}
				m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
				if m == nil || string(m[1]) != v {
					t.Errorf("ARG GO_VERSION=%s, but go.mod says go %s", v, m[1])
				}
			}
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:${GO_VERSION}") ||
		!(strings.HasPrefix(froms[1], "gcr.io/distroless/static") || froms[1] == "scratch") {
		t.Errorf("stages %q: want a golang builder and a distroless/static or scratch image", froms)
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0") {
		t.Errorf("USER %q: the image runs as root", user)
	}
	if len(builds) != 1 || !strings.HasPrefix(builds[0], "CGO_ENABLED=0 go build ") || !strings.Contains(builds[0], "./cmd/kvstrata") {
		t.Fatalf("the builder's go build %q is not CGO_ENABLED=0 go build … ./cmd/kvstrata", builds)
	}

	// The image's ports: what the ENV listens on is what it exposes.
	var listened []string
	for _, k := range []string{"KVSTRATA_LISTEN_GRPC", "KVSTRATA_LISTEN_DATA", "KVSTRATA_CLUSTER_RAFT_ADDR", "KVSTRATA_LISTEN_RESP", "KVSTRATA_LISTEN_HTTP"} {
		listened = append(listened, strconv.Itoa(int(portOf(t, env[k]))))
	}
	if strings.Join(listened, " ") != expose {
		t.Errorf("EXPOSE %s, but the node listens on %s", expose, strings.Join(listened, " "))
	}

	// The build command, run here as the builder runs it.
	out := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(builds[0], "/out/", out+"/"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1") // the command itself must turn cgo off
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", builds[0], err, b)
	}
	bin := filepath.Join(out, "kvstrata")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	libs, _ := f.ImportedLibraries()
	interp := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	f.Close()
	if interp || len(libs) > 0 {
		t.Errorf("%s is linked dynamically (interpreter %v, libraries %q)", bin, interp, libs)
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "CGO_ENABLED" && s.Value == "0" }) {
		t.Errorf("%s was built with cgo: %v", bin, bi.Settings)
	}

	// With the image's environment the node loads its configuration once
	// it is told what to advertise, and says so when it is not.
	run := func(extra ...string) (int, string) {
		c := exec.Command(bin, append([]string{"serve", "--data-dir", t.TempDir(), "--dram-capacity", "64MiB", "--print-config"}, extra...)...)
		c.Env = []string{}
		for k, v := range env {
			if k != "KVSTRATA_DATA_DIR" {
				c.Env = append(c.Env, k+"="+v)
			}
		}
		b, err := c.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(b)
		}
		return 0, string(b)
	}
	if code, msg := run(); code != 2 || !strings.Contains(msg, "set advertise.host") {
		t.Errorf("the image's node without an advertised host: exit %d:\n%s", code, msg)
	}
	if code, msg := run("--advertise-host", "127.0.0.1"); code != 0 {
		t.Errorf("the image's node advertising 127.0.0.1: exit %d:\n%s", code, msg)
	}

	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Logf("no image builder answers (docker info: %v): the image itself is not built", err)
		return
	}
	build := exec.Command("docker", "build", "-t", "kvstrata:test", ".")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, b)
	}
}

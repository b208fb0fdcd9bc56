package config

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// wantProblems loads flags and checks that the error lists every want.
func wantProblems(t *testing.T, flags map[string]string, want ...string) {
	t.Helper()
	_, err := Load("", noEnv, flags)
	if err == nil {
		t.Fatalf("%v accepted", flags)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: error does not say %q:\n%v", flags, w, err)
		}
	}
}

// NaN compared false with both bounds and passed; --print-config then
// wrote `high-watermark = NaN`, which TOML (and so --config) rejects.
func TestWatermarksMustBeFiniteAndInRange(t *testing.T) {
	wantProblems(t, map[string]string{"dram-high-watermark": "NaN", "ssd-low-watermark": "-Inf", "ssd-high-watermark": "1.5"},
		`dram.high-watermark: "NaN" is not a finite number`, `ssd.low-watermark: "-Inf" is not a finite number`,
		"ssd.high-watermark 1.5 outside (0, 1]")
	c := Default()
	c.DRAM.HighWatermark, c.SSD.LowWatermark = math.NaN(), math.Inf(1)
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "dram.high-watermark NaN outside (0, 1]") ||
		!strings.Contains(err.Error(), "ssd.low-watermark +Inf outside (0, high-watermark]") {
		t.Fatalf("Validate of NaN and +Inf watermarks: %v", err)
	}
}

// A port over 65535 passed validation and failed at listen time, after
// Raft had started.
func TestAddressesHaveUsablePorts(t *testing.T) {
	wantProblems(t, map[string]string{"listen-resp": "127.0.0.1:99999", "listen-data": "127.0.0.1:-1",
		"cluster-raft-addr": "127.0.0.1:0", "cluster-join": "10.0.0.1:70000", "s3-endpoint": "minio:nope"},
		`listen.resp "127.0.0.1:99999" has port 99999, over 65535`,
		`listen.data "127.0.0.1:-1" has port "-1", neither a number nor a known service`,
		`cluster.raft-addr "127.0.0.1:0" has port 0, which cannot be dialled`,
		`cluster.join "10.0.0.1:70000" has port 70000, over 65535`,
		`s3.endpoint "minio:nope" has port "nope"`)
	wantProblems(t, map[string]string{"cluster-bootstrap": "1=10.0.0.1:7072,2=10.0.0.2:65536"},
		`peer "2=10.0.0.2:65536": "10.0.0.2:65536" has port 65536, over 65535`)
	// Port 0 (any free port) and service names are fine where the node
	// listens.
	if _, err := Load("", noEnv, map[string]string{"listen-grpc": "127.0.0.1:0", "listen-http": "localhost:http"}); err != nil {
		t.Fatal(err)
	}
}

// 999TiB passed validation; the DRAM tier then failed to map it after Raft
// had started.
func TestDRAMCapacityMustFitTheMachine(t *testing.T) {
	total, err := memInfo("MemTotal")
	if err != nil {
		t.Skip("no /proc/meminfo:", err)
	}
	wantProblems(t, map[string]string{"dram-capacity": "999TiB"},
		"dram.capacity 999TiB is 2^32 pages of dram.page-size 4KiB or more",
		fmt.Sprintf("dram.capacity 999TiB (%d bytes) is more than this machine's memory", 999<<40),
		fmt.Sprintf("(%d bytes)", total))
	over := (total + 1<<30) &^ (1<<30 - 1)
	wantProblems(t, map[string]string{"dram-capacity": over.String(), "dram-page-size": "1MiB"},
		fmt.Sprintf("dram.capacity %v (%d bytes) is more than this machine's memory", over, over))
}

// Resolve's problems are configuration problems too (exit status 2).
func TestResolveProblemsAreConfigurationErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := Load("", noEnv, map[string]string{"ssd-dir": filepath.Join(file, "ssd")})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Resolve()
	if ce, ok := err.(*Error); !ok || len(ce.Problems) != 1 || !strings.HasPrefix(ce.Problems[0], "ssd.dir: mkdir") {
		t.Fatalf("Resolve with a file in the way of ssd.dir: %#v", err)
	}
}

// roundTrip prints l, loads the text back, and fails unless it is the same
// configuration.
func roundTrip(t *testing.T, l *Loaded) {
	t.Helper()
	text := l.Format()
	back, err := Load(writeFile(t, text), noEnv, nil)
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, text)
	}
	if back.Config != l.Config {
		t.Fatalf("round trip changed the config:\n%+v\n%+v\n%s", back.Config, l.Config, text)
	}
}

// Strings that look like numbers, or hold quotes, backslashes and control
// characters, once printed bare or with Go's escapes, which TOML reads
// differently or not at all.
func TestPrintedConfigQuotesEveryString(t *testing.T) {
	l, err := Load("", noEnv, map[string]string{"cluster-name": "007", "s3-prefix": "1e5",
		"ucx-tls": "a\"b\\c\x01\x7fd\té", "data-dir": "NaN", "ssd-dir": "true", "dram-low-watermark": "1e-05"})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, l)
}

// FuzzPrintedConfigLoadsBack: any configuration that validates prints to
// TOML that loads back as the same configuration. Each line of the input
// sets one flag: "flag=value".
func FuzzPrintedConfigLoadsBack(f *testing.F) {
	for _, s := range []string{
		"dram-high-watermark=NaN", "dram-high-watermark=0.9\ndram-low-watermark=1e-3",
		"cluster-name=007\ns3-prefix=1e5", "cluster-name=a\"b\\c\x01", "ucx-tls=\xff",
		"listen-resp=127.0.0.1:99999", "dram-capacity=999TiB", "node-id=4294967295\nlimits-max-batch-blocks=-0",
		"shutdown-timeout=1h2m3.5s\ns3-garbage-age=0", "log-level=debug\npprof=true",
	} {
		f.Add(s)
	}
	flags := map[string]bool{}
	def := Default()
	for _, s := range def.Settings() {
		flags[s.Flag()] = true
	}
	f.Fuzz(func(t *testing.T, in string) {
		set := map[string]string{}
		for _, line := range strings.Split(in, "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && flags[k] && k != "s3-secret-key" {
				set[k] = v
			}
		}
		l, err := Load("", noEnv, set)
		if err != nil {
			return
		}
		roundTrip(t, l)
	})
}

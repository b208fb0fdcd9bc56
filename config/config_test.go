package config

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

func noEnv(string) string { return "" }

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kvstrata.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	l, err := Load("", noEnv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.Listen.GRPC != "127.0.0.1:7070" || l.DataDir != "./data" || !l.SSD.Enabled || l.Sources["dram.policy"] != FromDefault {
		t.Fatalf("defaults: %+v", l.Config)
	}
}

func TestPrecedenceIsFlagThenEnvThenFileThenDefault(t *testing.T) {
	file := writeFile(t, `
log-level = "debug"
[dram]
capacity = "1GiB"
policy = "lfu"
high-watermark = 0.9
[ssd]
wal = true
`)
	env := map[string]string{"KVSTRATA_DRAM_CAPACITY": "2GiB", "KVSTRATA_DRAM_POLICY": "prefix"}
	flags := map[string]string{"dram-capacity": "3GiB"}
	l, err := Load(file, func(k string) string { return env[k] }, flags)
	if err != nil {
		t.Fatal(err)
	}
	if l.DRAM.Capacity != 3<<30 || l.Sources["dram.capacity"] != FromFlag {
		t.Errorf("capacity %v from %s, want 3GiB from the flag", l.DRAM.Capacity, l.Sources["dram.capacity"])
	}
	if l.DRAM.Policy != "prefix" || l.Sources["dram.policy"] != FromEnv {
		t.Errorf("policy %q from %s, want prefix from env", l.DRAM.Policy, l.Sources["dram.policy"])
	}
	if l.DRAM.HighWatermark != 0.9 || !l.SSD.WAL || l.LogLevel != "debug" || l.Sources["ssd.wal"] != FromFile {
		t.Errorf("file values lost: %+v", l.Config)
	}
	if l.DRAM.LowWatermark != 0.85 || l.Sources["dram.low-watermark"] != FromDefault {
		t.Errorf("default lost: %v", l.DRAM.LowWatermark)
	}
}

func TestEveryProblemIsReportedAtOnce(t *testing.T) {
	file := writeFile(t, `
[dram]
capcity = "1GiB"
policy = "mru"
[limits]
max-block-size = "lots"
`)
	env := map[string]string{"KVSTRATA_SSD_ADMIT_MIN_SEEN": "zero", "KVSTRATA_LISTEN_RESP": "6380"}
	_, err := Load(file, func(k string) string { return env[k] }, map[string]string{"node-id": "0", "transport": "ucx", "ssd-file-min-size": "0", "ssd-open-files": "-1", "ssd-record-cache": "-1", "ssd-read-ahead": "0", "fetch-concurrency": "1025"})
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	for _, want := range []string{
		`unknown key "dram.capcity" (did you mean "dram.capacity"?)`,
		`dram.policy "mru" is unknown (want lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd)`,
		`limits.max-block-size: size "lots"`,
		`KVSTRATA_SSD_ADMIT_MIN_SEEN: ssd.admit-min-seen: "zero" is not an integer`,
		`listen.resp "6380" is not host:port`,
		"node-id must be > 0",
		"built without UCX support",
		"ssd.file-min-size 0 must be above 0",
		"ssd.open-files -1 is negative",
		"ssd.record-cache -1 is out of range",
		"ssd.read-ahead 0 must be above 0",
		"fetch-concurrency 1025 outside [1, 1024]",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

func TestFileErrorsAreClear(t *testing.T) {
	for text, want := range map[string]string{
		"[dram\n":                "kvstrata.toml",
		"[a.b]\nc = 1\n":         `table "a.b" is nested too deep`,
		"dram = [1, 2]\n":        "want a string, number or boolean",
		"shutdown-timeout = 5\n": `"5" is not a duration`,
	} {
		_, err := Load(writeFile(t, text), noEnv, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("file %q: got %v, want it to say %q", text, err, want)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml"), noEnv, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}

func TestPrintedConfigLoadsBackTheSame(t *testing.T) {
	l, err := Load("", func(k string) string {
		return map[string]string{"KVSTRATA_DRAM_CAPACITY": "768MiB", "KVSTRATA_SHUTDOWN_TIMEOUT": "1m"}[k]
	}, map[string]string{"ssd-dir": "/tmp/x y"})
	if err != nil {
		t.Fatal(err)
	}
	text := l.Format()
	if !strings.Contains(text, "capacity = \"768MiB\"") || !strings.Contains(text, "env KVSTRATA_DRAM_CAPACITY") || !strings.Contains(text, "flag --ssd-dir") {
		t.Fatalf("printed config lacks values or sources:\n%s", text)
	}
	back, err := Load(writeFile(t, text), noEnv, nil)
	if err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, text)
	}
	if back.Config != l.Config || back.ShutdownTimeout != time.Minute {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", back.Config, l.Config)
	}
}

func TestEverySettingHasDistinctNames(t *testing.T) {
	c := Default()
	seen := [3]map[string]bool{{}, {}, {}}
	for _, s := range c.Settings() {
		for i, n := range []string{s.Key, s.Flag(), s.Env()} {
			if seen[i][n] {
				t.Errorf("name %q used twice", n)
			}
			seen[i][n] = true
		}
		if s.Usage == "" {
			t.Errorf("%s has no usage text", s.Key)
		}
		if err := s.Set(s.Value()); err != nil {
			t.Errorf("%s does not read back its own value %q: %v", s.Key, s.Value(), err)
		}
	}
}

func TestResolveSizesFromTheMachine(t *testing.T) {
	l, err := Load("", noEnv, map[string]string{"data-dir": t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Resolve(); err != nil {
		t.Fatal(err)
	}
	if l.DRAM.Capacity < 64<<20 || l.DRAM.Capacity > 64<<30 || l.Sources["dram.capacity"] != FromAuto {
		t.Errorf("dram capacity %v", l.DRAM.Capacity)
	}
	if l.SSD.Capacity < 256<<20 || !strings.HasSuffix(l.SSD.Dir, "ssd") {
		t.Errorf("ssd %v in %s", l.SSD.Capacity, l.SSD.Dir)
	}
}

func TestByteSizes(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"4096": 4096, "64KiB": 64 << 10, "4 MiB": 4 << 20, "1.5GiB": 3 << 29, "10GB": 10e9,
		"2k": 2048, "1e6": 1e6, " 7 b ": 7,
	} {
		got, err := ParseByteSize(in)
		if err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "4 parsecs", "1e400", "NaN", "1..2k"} {
		if _, err := ParseByteSize(in); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", in)
		}
	}
	if s := ByteSize(3 << 29).String(); s != "1536MiB" {
		t.Errorf("String = %q", s)
	}
}

func FuzzParseByteSize(f *testing.F) {
	for _, s := range []string{"4096", "64KiB", "1.5 GiB", "1e6", "-3", "k", "9999999999999TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseByteSize(s)
		if err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("ParseByteSize(%q) = %d < 0", s, b)
		}
		// What String prints parses back to the same size.
		if back, err := ParseByteSize(b.String()); err != nil || back != b {
			t.Fatalf("%q → %d → %q → %d, %v", s, b, b.String(), back, err)
		}
	})
}

func TestS3PromoteTo(t *testing.T) {
	for _, c := range []struct {
		value string
		ssd   bool
		want  []index.TierKind
		err   string
	}{
		{"dram", true, []index.TierKind{index.TierDRAM}, ""},
		{"ssd, dram", true, []index.TierKind{index.TierDRAM, index.TierSSD}, ""},
		{"ssd", false, nil, "names ssd, and ssd.enabled is false"},
		{"hbm", true, nil, `"hbm" is not dram or ssd`},
		{"", true, nil, `"" is not dram or ssd`},
	} {
		got, err := S3{PromoteTo: c.value}.PromoteKinds(c.ssd)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("promote-to %q (ssd %v): %v, want an error saying %q", c.value, c.ssd, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("promote-to %q: %v %v, want %v", c.value, got, err, c.want)
		}
	}
	_, err := Load("", func(string) string { return "" }, map[string]string{"s3-endpoint": "127.0.0.1:9000", "s3-promote-to": "disk"})
	if err == nil || !strings.Contains(err.Error(), `s3.promote-to "disk"`) {
		t.Fatalf("serve with s3.promote-to=disk: %v", err)
	}
}

func TestSSDRecordCacheIsBounded(t *testing.T) {
	for _, c := range []struct {
		value string
		err   string
	}{
		{"0", ""},
		{"65536", ""},
		{strconv.Itoa(maxRecordCache), ""},
		{strconv.Itoa(maxRecordCache + 1), "ssd.record-cache 22369622 is out of range"},
		{"-1", "ssd.record-cache -1 is out of range"},
	} {
		_, err := Load("", func(string) string { return "" }, map[string]string{"ssd-record-cache": c.value})
		switch {
		case c.err == "" && err != nil:
			t.Errorf("ssd.record-cache %s: %v", c.value, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ssd.record-cache %s: %v, want an error saying %q", c.value, err, c.err)
		}
	}
}

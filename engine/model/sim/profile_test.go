package sim

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ms turns a time in milliseconds into a Duration the way Curve.At does.
func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// near reports whether two durations agree within a microsecond, the
// rounding of float milliseconds to nanoseconds.
func near(a, b time.Duration) bool { return (a - b).Abs() <= time.Microsecond }

func TestDefaultProfileIsDynamoMockerPolynomial(t *testing.T) {
	p := DefaultProfile()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	// prefill ms = 4.209989e-7·T² + 1.518344e-2·T + 16.50142
	for _, tok := range []float64{0, 1, 128, 1000, 4096, 32768} {
		want := ms(4.209989e-7*tok*tok + 1.518344e-2*tok + 16.50142)
		if got := p.Prefill.At(tok, 1); !near(got, want) {
			t.Errorf("prefill of %v tokens: %v, the published polynomial says %v", tok, got, want)
		}
	}
	// decode ms = −25.74·p² + 54.01·p + 5.74
	for _, x := range []float64{0, 0.25, 0.5, 1} {
		want := ms(-25.74*x*x + 54.01*x + 5.74)
		if got := p.Decode.At(x, 8); !near(got, want) {
			t.Errorf("decode at p=%v: %v, the published polynomial says %v", x, got, want)
		}
	}
	if !strings.Contains(p.Source, "Dynamo") {
		t.Errorf("the default profile's source %q does not name Dynamo's mocker", p.Source)
	}
}

func TestDecodeNeverBelowOneMillisecond(t *testing.T) {
	p := DefaultProfile()
	// Past p = 2.4 the published parabola goes below 1 ms and then negative.
	for _, x := range []float64{0, 0.5, 1, 2.2, 2.5, 3, 10, 1e6} {
		if got := p.Decode.At(x, 1); got < time.Millisecond {
			t.Errorf("decode at p=%v: %v, below 1 ms", x, got)
		}
	}
	m, err := New(Config{Capacity: 100})
	if err != nil {
		t.Fatal(err)
	}
	// p is capped at 1: a batch holding more than the capacity costs what a full pool does.
	if got, full := m.DecodeTime(1_000_000, 4), m.DecodeTime(100, 4); got != full {
		t.Errorf("decode over capacity: %v, want the full pool's %v", got, full)
	}
}

func TestTabulatedProfileInterpolates(t *testing.T) {
	c := Curve{Points: [][2]float64{{0, 10}, {100, 20}, {200, 40}}}
	for _, tc := range []struct{ x, want float64 }{
		{0, 10}, {50, 15}, {100, 20}, {150, 30}, {200, 40},
		{300, 60}, // past the last point, along the last segment
		{-50, 5},  // before the first, along the first
		{-500, 0}, // never negative
	} {
		if got := c.At(tc.x, 3); !near(got, ms(tc.want)) {
			t.Errorf("at %v: %v, want %v ms", tc.x, got, tc.want)
		}
	}
	c.PerSeqMs, c.MinMs = 0.5, 12
	if got := c.At(0, 4); !near(got, ms(12)) {
		t.Errorf("at 0 with min_ms 12: %v, want 12 ms", got)
	}
	if got := c.At(100, 4); !near(got, ms(22)) {
		t.Errorf("at 100 with 4 sequences at 0.5 ms each: %v, want 22 ms", got)
	}
}

func TestProfileFileRoundTrips(t *testing.T) {
	for name, p := range map[string]Profile{
		"default": DefaultProfile(),
		"table": {Version: 1, Source: "profiler run", Prefill: Curve{Points: [][2]float64{{1, 17}, {512, 25.5}, {8192, 180}}, PerSeqMs: 0.25},
			Decode: Curve{Points: [][2]float64{{0, 6}, {0.5, 26}, {1, 33}}, MinMs: 1}},
	} {
		path := filepath.Join(t.TempDir(), name+".json")
		data, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadProfile(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		again, _ := got.Marshal()
		if !bytes.Equal(again, data) {
			t.Errorf("%s: read back as\n%s\nwritten as\n%s", name, again, data)
		}
	}
}

func TestBadProfileNamesField(t *testing.T) {
	const decode = `"decode": {"poly": [5.74, 54.01, -25.74], "min_ms": 1}`
	for _, tc := range []struct{ json, want string }{
		{`not json`, "invalid character"},
		{`{"prefil": {"poly": [1]}, ` + decode + `}`, `unknown field "prefil"`},
		{`{"prefill": {"poly": "1"}, ` + decode + `}`, "prefill.poly"},
		{`{` + decode + `}`, "prefill.poly or prefill.points is required"},
		{`{"prefill": {"poly": [1], "points": [[0, 1], [1, 2]]}, ` + decode + `}`, "prefill.poly and prefill.points are both given"},
		{`{"prefill": {"points": [[0, 1]]}, ` + decode + `}`, "prefill.points has 1 point"},
		{`{"prefill": {"points": [[0, 1], [0, 2]]}, ` + decode + `}`, "prefill.points[1] has x 0"},
		{`{"prefill": {"points": [[0, 1], [1, -2]]}, ` + decode + `}`, "prefill.points[1] has -2 ms"},
		{`{"prefill": {"poly": [1,2,3,4,5,6,7,8,9,10]}, ` + decode + `}`, "prefill.poly has 10 coefficients"},
		{`{"prefill": {"poly": [1]}, "decode": {"poly": [1], "min_ms": -1}}`, "decode.min_ms is -1"},
		{`{"prefill": {"poly": [1], "per_seq_ms": -3}, ` + decode + `}`, "prefill.per_seq_ms is -3"},
		{`{"version": 3, "prefill": {"poly": [1]}, ` + decode + `}`, "version is 3, this reader knows 1 and 2"},
		{`{"prefill": {"poly": [1]}, ` + decode + `, "worker": {"kv_tokens": 1}}`, "worker is a version 2 field"},
		{`{"version": 1, "prefill": {"poly": [1]}, ` + decode + `, "sweep": {}}`, "sweep is a version 2 field"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "worker": {"kv_tokens": -1}}`, "worker.kv_tokens is -1"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "worker": {"max_num_seqs": 64, "max_num_batched_tokens": 32}}`, "worker.max_num_batched_tokens is 32"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "worker": {"kv_token": 1}}`, `unknown field "kv_token"`},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "sweep": {"prefill": [{"isl": 0, "ttft_ms": 1}]}}`, "sweep.prefill[0].isl is 0"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "sweep": {"prefill": [{"isl": 5, "ttft_ms": -1}]}}`, "sweep.prefill[0].ttft_ms is -1"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "sweep": {"decode": [{"concurrency": 0, "context": 0, "itl_ms": 0}]}}`, "sweep.decode[0].concurrency is 0, must be ≥ 1; sweep.decode[0].context is 0, must be ≥ 1; sweep.decode[0].itl_ms is 0"},
		{`{"version": 2, "prefill": {"poly": [1]}, ` + decode + `, "sweep": {"decode": [{"concurrency": 1, "context": 1, "itl_ms": 1, "ttft_ms": 1}]}}`, `unknown field "ttft_ms"`},
		{`{"prefill": {"poly": [1]}, ` + decode + `} {}`, "data after"},
	} {
		_, err := ParseProfile([]byte(tc.json))
		if !errors.Is(err, ErrBadProfile) {
			t.Errorf("%s: error %v, want ErrBadProfile", tc.json, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not say %q", tc.json, err, tc.want)
		}
	}
}

func FuzzParseProfile(f *testing.F) {
	def, _ := DefaultProfile().Marshal()
	f.Add(def)
	files, _ := filepath.Glob("testdata/*.json")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"prefill": {"points": [[0, 1], [100, 2]]}, "decode": {"points": [[0, 6], [1, 33]], "min_ms": 1, "per_seq_ms": 0.1}}`))
	f.Add([]byte(`{"prefill": {"poly": [1e308, 1e308]}, "decode": {"poly": [-1e308]}}`))
	f.Add([]byte(`{"prefill": {"points": [[0, 1], [1e-300, 1e300]]}, "decode": {"poly": [1]}}`))
	f.Add([]byte(`{"version": 1, "prefill": {"poly": [1]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseProfile(data)
		if err != nil {
			if !errors.Is(err, ErrBadProfile) {
				t.Fatalf("error %v is not ErrBadProfile", err)
			}
			return
		}
		out, err := p.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		q, err := ParseProfile(out)
		if err != nil {
			t.Fatalf("a profile read back fails: %v\n%s", err, out)
		}
		if again, _ := q.Marshal(); !bytes.Equal(again, out) {
			t.Fatalf("round trip changed the profile:\n%s\n%s", out, again)
		}
		for _, x := range []float64{0, 1, 0.5, 1e4, -1, math.MaxFloat64} {
			for _, c := range []Curve{p.Prefill, p.Decode} {
				if d := c.At(x, 64); d < 0 || d > MaxStep {
					t.Fatalf("at %v: %v, outside [0, %v]", x, d, MaxStep)
				}
			}
		}
	})
}

// TestProfileFilesInTestdata: the default profile as a file, which a
// worker, a replay and the planner read, is the one built in; the table
// example parses.
func TestProfileFilesInTestdata(t *testing.T) {
	p, err := ReadProfile("testdata/dynamo-mocker.json")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := p.Marshal()
	want, _ := DefaultProfile().Marshal()
	if !bytes.Equal(got, want) {
		t.Errorf("testdata/dynamo-mocker.json reads as\n%s\nthe built-in default is\n%s", got, want)
	}
	tab, err := ReadProfile("testdata/table.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Decode.At(0.5, 10); !near(got, ms(26.3+0.2)) {
		t.Errorf("table decode at p=0.5 with 10 sequences: %v, want 26.5 ms", got)
	}
	v2, err := ReadProfile("testdata/profiled-v2.json")
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != 2 || v2.Worker == nil || v2.Worker.KVTokens != 65536 || v2.Worker.MaxNumBatchedTokens != 2048 {
		t.Errorf("testdata/profiled-v2.json: version %d, worker %+v; want version 2 with 65536 KV tokens and 2048 batched", v2.Version, v2.Worker)
	}
	if v2.Sweep == nil || len(v2.Sweep.Prefill) == 0 || len(v2.Sweep.Decode) == 0 {
		t.Errorf("testdata/profiled-v2.json: sweep %+v, want prefill and decode points", v2.Sweep)
	}
}

// TestSimIgnoresTheSweep: a version-2 profile steps as its curves say,
// whatever its sweep holds, and a version-1 file reads as before.
func TestSimIgnoresTheSweep(t *testing.T) {
	p := DefaultProfile()
	p.Version = 2
	p.Worker = &WorkerLimits{KVTokens: 1000, BlockTokens: 16, MaxNumSeqs: 8, MaxNumBatchedTokens: 512}
	p.Sweep = &Sweep{Prefill: []PrefillPoint{{ISL: 128, TTFTMs: 1e6}}, Decode: []DecodePoint{{Concurrency: 1, Context: 10, ITLMs: 1e6}}}
	with, err := New(Config{Capacity: 1000, Profile: &p})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := New(Config{Capacity: 1000})
	if a, b := with.PrefillTime(128, 1), plain.PrefillTime(128, 1); a != b {
		t.Errorf("prefill of 128 tokens: %v with a sweep, %v without", a, b)
	}
	if a, b := with.DecodeTime(500, 4), plain.DecodeTime(500, 4); a != b {
		t.Errorf("decode at p=0.5: %v with a sweep, %v without", a, b)
	}
}

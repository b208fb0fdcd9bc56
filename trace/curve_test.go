package trace

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCurve(t *testing.T) {
	c, err := ParseCurve("steps:0.25@0,1@900,0.5@1800,0.25@2700")
	if err != nil {
		t.Fatal(err)
	}
	for at, want := range map[float64]float64{0: 0.25, 899.9: 0.25, 900: 1, 1799: 1, 1800: 0.5, 2700: 0.25, 1e6: 0.25} {
		if got := c.Rate(at); got != want {
			t.Errorf("steps: Rate(%v) = %v, want %v", at, got, want)
		}
	}
	d, err := ParseCurve("day:period=3600,min=0.1,sharp=2")
	if err != nil {
		t.Fatal(err)
	}
	if d.Rate(0) != 0.1 || math.Abs(d.Rate(1800)-1) > 1e-12 || math.Abs(d.Rate(3600)-0.1) > 1e-12 {
		t.Errorf("day: trough %v, peak %v, next trough %v; want 0.1, 1, 0.1", d.Rate(0), d.Rate(1800), d.Rate(3600))
	}
	// The mean over a period is min + (1−min)·3/8 = 0.4375 for sharp 2.
	if m := d.integral(0, 3600) / 3600; math.Abs(m-0.4375) > 1e-6 {
		t.Errorf("day: mean/peak = %v, want 0.4375", m)
	}
	if def, _ := ParseCurve("day:period=60"); def.min != DefaultDayMin || def.sharp != DefaultDaySharp {
		t.Errorf("day defaults: min %v sharp %v", def.min, def.sharp)
	}
}

func TestParseCurveRejectsBadSpecs(t *testing.T) {
	for spec, want := range map[string]string{
		"":                        "want steps:",
		"ramp:1":                  "want steps:",
		"steps:":                  "want RATE@SECONDS",
		"steps:1@5":               "starts at 5 s, want 0",
		"steps:1@0,2@0":           "does not come after",
		"steps:1@0,2@-1":          "time in seconds",
		"steps:-1@0":              "rate in [0, 1e9]",
		"steps:0@0,0@10":          "every rate is 0",
		"steps:NaN@0":             "rate in [0, 1e9]",
		"day:min=0.1":             "period=SECONDS is required",
		"day:period=0":            "period 0",
		"day:period=60,min=2":     "min 2",
		"day:period=60,sharp=0":   "sharp 0",
		"day:period=60,tilt=1":    `unknown parameter "tilt"`,
		"day:period=60,period=30": "period given twice",
		"day:period":              "KEY=NUMBER",
	} {
		_, err := ParseCurve(spec)
		if !errors.Is(err, ErrBadCurve) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCurve(%q) = %v, want ErrBadCurve saying %q", spec, err, want)
		}
	}
}

func FuzzParseCurve(f *testing.F) {
	for _, s := range []string{"steps:0.25@0,1@900,0.5@1800", "day:period=3600,min=0.1,sharp=2", "steps:1@0", "day:period=1e-300"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := ParseCurve(spec)
		if err != nil {
			if !errors.Is(err, ErrBadCurve) {
				t.Fatalf("ParseCurve(%q) = %v, not ErrBadCurve", spec, err)
			}
			return
		}
		for _, at := range []float64{0, 0.05, 1, 59.9, 3600, 1e7} {
			if r := c.Rate(at); !(r >= 0) || math.IsInf(r, 0) {
				t.Fatalf("%s: Rate(%v) = %v", spec, at, r)
			}
		}
	})
}

// bursty is a trace of n requests whose arrivals come in bursts at an
// uneven rate, with hash ids that tell them apart.
func bursty(n int) []Request {
	r := rand.New(rand.NewPCG(3, 4))
	reqs := make([]Request, n)
	ts := int64(0)
	for i := range reqs {
		if r.IntN(4) > 0 { // a quarter of the requests share the previous timestamp
			ts += int64(r.ExpFloat64() * float64(1+i%500))
		}
		reqs[i] = Request{Timestamp: ts, InputLength: int64(r.IntN(9000)), OutputLength: int64(r.IntN(600)), HashIDs: []uint64{uint64(i), r.Uint64()}}
	}
	return reqs
}

func TestRescaleFollowsAStepCurve(t *testing.T) {
	in := bursty(20000)
	orig := slices.Clone(in)
	c, _ := ParseCurve("steps:0.25@0,1@300,0.5@600,0.25@900")
	const d = 1200 * time.Second
	out, err := Rescale(in, c, d)
	if err != nil {
		t.Fatal(err)
	}
	// Arrivals per step window match the curve's share within 5 %.
	weights := []float64{0.25 * 300, 1 * 300, 0.5 * 300, 0.25 * 300}
	total := 0.0
	for _, w := range weights {
		total += w
	}
	counts := make([]float64, 4)
	for i, r := range out {
		if i > 0 && r.Timestamp < out[i-1].Timestamp {
			t.Fatalf("timestamp %d at request %d comes before %d", r.Timestamp, i, out[i-1].Timestamp)
		}
		if r.Timestamp < 0 || r.Timestamp > d.Milliseconds() {
			t.Fatalf("timestamp %d outside [0, %d]", r.Timestamp, d.Milliseconds())
		}
		counts[min(r.Timestamp/300000, 3)]++
	}
	for i, w := range weights {
		want := float64(len(in)) * w / total
		if math.Abs(counts[i]-want) > 0.05*want {
			t.Errorf("window %d: %v arrivals, want %v ± 5 %%", i, counts[i], want)
		}
	}
	// The rows are the same multiset, in the original order, and the
	// input is untouched.
	if !slices.EqualFunc(in, orig, equalRequest) {
		t.Fatal("Rescale modified its input")
	}
	for i := range out {
		o := out[i]
		o.Timestamp = in[i].Timestamp // the trace is sorted: order is kept
		if !equalRequest(o, in[i]) {
			t.Fatalf("request %d: %+v, want %+v with a new timestamp", i, out[i], in[i])
		}
		if i > 0 && in[i].Timestamp == in[i-1].Timestamp && out[i].Timestamp != out[i-1].Timestamp {
			t.Fatalf("requests %d and %d arrived together and no longer do", i-1, i)
		}
	}
}

func equalRequest(a, b Request) bool {
	return a.Timestamp == b.Timestamp && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
}

func TestRescaleFollowsADayCurve(t *testing.T) {
	in := bursty(30000)
	c, _ := ParseCurve("day:period=600,min=0.1,sharp=2")
	out, err := Rescale(in, c, 1200*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The peak minute (270–330 s) against the trough minute (570–630 s).
	var peak, trough float64
	for _, r := range out {
		switch s := r.Timestamp / 1000; {
		case s >= 270 && s < 330:
			peak++
		case s >= 570 && s < 630:
			trough++
		}
	}
	wantPeak := float64(len(in)) * c.integral(270, 330) / c.integral(0, 1200)
	wantTrough := float64(len(in)) * c.integral(570, 630) / c.integral(0, 1200)
	if math.Abs(peak-wantPeak) > 0.05*wantPeak || math.Abs(trough-wantTrough) > 0.1*wantTrough {
		t.Errorf("peak minute %v (want %v), trough minute %v (want %v)", peak, wantPeak, trough, wantTrough)
	}
}

func TestRescaleRejectsWhatItCannotDo(t *testing.T) {
	c, _ := ParseCurve("steps:0@0,1@100")
	if _, err := Rescale(bursty(10), c, 50*time.Second); err == nil || !strings.Contains(err.Error(), "is 0 over all of 50s") {
		t.Errorf("a curve 0 over the duration: %v", err)
	}
	if _, err := Rescale(bursty(10), c, time.Millisecond); err == nil || !strings.Contains(err.Error(), "want at least") {
		t.Errorf("a duration of 1ms: %v", err)
	}
	if out, err := Rescale(nil, c, time.Hour); err != nil || len(out) != 0 {
		t.Errorf("no requests: %v, %v", out, err)
	}
}

func TestWriteReadsBack(t *testing.T) {
	in := append(bursty(50), Request{Timestamp: 7})
	var buf bytes.Buffer
	if err := Write(&buf, in); err != nil {
		t.Fatal(err)
	}
	back, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range in {
		if in[i].HashIDs == nil {
			in[i].HashIDs = []uint64{}
		}
	}
	if !slices.EqualFunc(in, back, equalRequest) {
		t.Errorf("written and read back: %v, want %v", fmt.Sprint(back[:2]), fmt.Sprint(in[:2]))
	}
}

package predict

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/trace"
)

func mustNew(t *testing.T, spec string) Predictor {
	t.Helper()
	p, err := New(spec)
	if err != nil {
		t.Fatalf("New(%q): %v", spec, err)
	}
	return p
}

func TestEveryKindPredictsZeroOnAnEmptySeries(t *testing.T) {
	for _, spec := range All(4) {
		p := mustNew(t, spec)
		if got := p.Predict(1); got != 0 {
			t.Errorf("%s: empty series predicts %v, want 0", spec, got)
		}
		// NaN and ±Inf are not evidence.
		p.Observe(math.NaN())
		p.Observe(math.Inf(1))
		if got := p.Predict(3); got != 0 {
			t.Errorf("%s: after NaN and Inf predicts %v, want 0", spec, got)
		}
	}
}

func TestPredictionsAreFlooredAtZero(t *testing.T) {
	for _, spec := range All(4) {
		p := mustNew(t, spec)
		for i := range 60 {
			p.Observe(float64(60 - i)) // a steep fall through zero
		}
		for _, h := range []int{1, 10, 100} {
			if got := p.Predict(h); got < 0 || math.IsNaN(got) {
				t.Errorf("%s: Predict(%d) on a falling series = %v, want ≥ 0", spec, h, got)
			}
		}
	}
}

func TestNameRoundTrips(t *testing.T) {
	for _, spec := range append(All(12), "ma:3", "ewma", "ewma:0.5", "holt:0.3,0.2", "kalman:1,0.5,2", "holt-winters:period=5,a=0.2,g=0.1", "arima:2,0,1") {
		p := mustNew(t, spec)
		q := mustNew(t, p.Name())
		if q.Name() != p.Name() {
			t.Errorf("%s: Name %q makes %q", spec, p.Name(), q.Name())
		}
	}
}

func TestBadSpecsAreClearErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"":                                "empty",
		"prophet":                         `unknown kind "prophet"`,
		"constant:1":                      "no parameters",
		"ma":                              "ma:N",
		"ma:0":                            "[1, 100000]",
		"ma:x":                            "[1, 100000]",
		"holt:0.5":                        "want 0 or 2 parameters, got 1",
		"ewma:0":                          "a is 0",
		"ewma:0.1,0.2":                    "want 0 or 1 parameters",
		"holt:0,0.1":                      "a is 0",
		"holt:0.5,nan":                    `"nan" is not a number`,
		"kalman:1,2":                      "want 0 or 3",
		"kalman:1,1,0":                    "r in (0",
		"holt-winters":                    "period=P",
		"holt-winters:a=0.3":              "period=P is required",
		"holt-winters:0.3":                "period=P first",
		"holt-winters:period=1":           "[2, 100000]",
		"holt-winters:period=4,a=2":       "a is 2",
		"holt-winters:period=4,z=1":       `unknown parameter "z"`,
		"holt-winters:period=4,a=0.2,0.3": "a given twice",
		"holt-winters:period=4,1,1,1,1":   "period=P first, then up to three",
		"arima:1,2,0":                     "d in [0, 1]",
		"arima:4,0,0":                     "p in [0, 3]",
		"arima:1.5,0,0":                   "whole numbers",
		"arima:1,1":                       "want 3 parameters",
	} {
		_, err := New(spec)
		if !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), want) {
			t.Errorf("New(%q) = %v, want ErrBadSpec saying %q", spec, err, want)
		}
	}
}

func FuzzNew(f *testing.F) {
	for _, s := range append(All(6), "ma:3", "holt-winters:period=3,0.1,0.2,0.3", "arima:3,1,2", "kalman:0,0,1e12", "x:") {
		f.Add(s, 1.5, -3.0)
	}
	f.Fuzz(func(t *testing.T, spec string, a, b float64) {
		p, err := New(spec)
		if err != nil {
			if !errors.Is(err, ErrBadSpec) {
				t.Fatalf("New(%q) = %v, not ErrBadSpec", spec, err)
			}
			return
		}
		if strings.HasPrefix(p.Name(), "arima") {
			return // fitting on every input is too slow to fuzz
		}
		for i := range 30 {
			p.Observe([]float64{a, b, a * b, float64(i)}[i%4])
			if v := p.Predict(i); !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("%s: Predict = %v after %v, %v", spec, v, a, b)
			}
		}
	})
}

func ramp(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = 5 + 2*float64(i)
	}
	return xs
}

func TestHoltAndKalmanTrackARamp(t *testing.T) {
	xs := ramp(200)
	for _, spec := range []string{"holt:0.5,0.1", "kalman"} {
		p := mustNew(t, spec)
		for _, x := range xs {
			p.Observe(x)
		}
		for _, h := range []int{1, 5} {
			want := 5 + 2*float64(len(xs)-1+h)
			if got := p.Predict(h); math.Abs(got-want) > 0.01*want {
				t.Errorf("%s: Predict(%d) = %v on the ramp, want %v ± 1 %%", spec, h, got, want)
			}
		}
		// The error falls to 0 as the trend is learnt.
		s := Backtest(mustNew(t, spec), xs, 150, 1)
		if s.MAE > 0.01 {
			t.Errorf("%s: MAE over the ramp's last 50 points = %v, want → 0", spec, s.MAE)
		}
	}
}

func TestHoltWintersRecoversASine(t *testing.T) {
	const period = 12
	x := func(i int) float64 { return 10 + 4*math.Sin(2*math.Pi*float64(i)/period) }
	p := mustNew(t, "holt-winters:period=12")
	for i := range 20 * period {
		p.Observe(x(i))
	}
	for h := 1; h <= period; h++ {
		if got, want := p.Predict(h), x(20*period-1+h); math.Abs(got-want) > 0.05 {
			t.Errorf("Predict(%d) = %v, want %v ± 0.05", h, got, want)
		}
	}
	// Holt without the season cannot follow it.
	hw := Backtest(mustNew(t, "holt-winters:period=12"), seq(x, 20*period), 5*period, 3)
	ho := Backtest(mustNew(t, "holt:0.5,0.1"), seq(x, 20*period), 5*period, 3)
	if hw.MAE > 0.05 || ho.MAE < 10*hw.MAE {
		t.Errorf("MAE 3 ahead: holt-winters %v (want ≤ 0.05), holt %v (want ≥ 10× worse)", hw.MAE, ho.MAE)
	}
}

func seq(x func(int) float64, n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = x(i)
	}
	return xs
}

func TestARIMARecoversAnAR1Coefficient(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 14))
	xs := make([]float64, 600)
	v := 0.0
	for i := range xs {
		v = 0.7*v + r.NormFloat64()
		xs[i] = 50 + v
	}
	f := fitCSS(xs, order{1, 0, 0})
	if !f.ok || math.Abs(f.phi[0]-0.7) > 0.05 {
		t.Fatalf("ARIMA(1,0,0) fit: φ = %v (ok %v), want 0.7 ± 0.05", f.phi, f.ok)
	}
	if math.Abs(f.mu-50) > 0.5 || math.Abs(f.sigma2-1) > 0.15 {
		t.Errorf("μ = %v, σ² = %v, want 50 and 1", f.mu, f.sigma2)
	}
	// The predictor forecasts with it: one step ahead is μ + φ(x − μ).
	p := mustNew(t, "arima:1,0,0")
	for _, x := range xs {
		p.Observe(x)
	}
	last := xs[len(xs)-1]
	if got, want := p.Predict(1), 50+0.7*(last-50); math.Abs(got-want) > 0.1*math.Abs(last-50)+0.3 {
		t.Errorf("Predict(1) = %v, want about %v", got, want)
	}
}

func TestAutoARIMAPicksOneDifferenceForARandomWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	walk, noise := make([]float64, 300), make([]float64, 300)
	v := 100.0
	for i := range walk {
		v += r.NormFloat64()
		walk[i] = v
		noise[i] = 100 + r.NormFloat64()
	}
	for _, c := range []struct {
		name string
		xs   []float64
		d    int
	}{{"random walk", walk, 1}, {"white noise", noise, 0}} {
		p := mustNew(t, "arima").(*autoARIMA)
		for _, x := range c.xs {
			p.Observe(x)
		}
		if _, d, _, ok := p.Order(); !ok || d != c.d {
			t.Errorf("%s: auto-ARIMA chose d = %d (fitted %v), want %d", c.name, d, ok, c.d)
		}
	}
}

func TestARIMAFallsBackToHoltWithFewPoints(t *testing.T) {
	p, h := mustNew(t, "arima:2,1,1"), mustNew(t, "holt:0.5,0.1")
	for _, x := range []float64{1, 3, 5, 7} {
		p.Observe(x)
		h.Observe(x)
	}
	if p.Predict(2) != h.Predict(2) || p.Predict(2) != 11 {
		t.Errorf("ARIMA with 4 points predicts %v, Holt %v; want both 11", p.Predict(2), h.Predict(2))
	}
}

func TestSeriesCountsArrivalsPerWindow(t *testing.T) {
	reqs := []trace.Request{{Timestamp: 1000}, {Timestamp: 1500}, {Timestamp: 2999}, {Timestamp: 9000}}
	got := Series(reqs, 2*time.Second)
	// The last window, [9000, 11000), is covered for 0 ms of 2000: left out.
	want := []float64{1.5, 0, 0, 0}
	if len(got) != len(want) {
		t.Fatalf("Series = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Series = %v, want %v", got, want)
		}
	}
	if got := Series(reqs, 5*time.Second); len(got) != 2 || got[1] != 0.2 {
		t.Errorf("at 5 s windows Series = %v, want [0.6 0.2]: the last window is 3 s of 5", got)
	}
	if Series(nil, time.Second) != nil || Series(reqs, 0) != nil {
		t.Error("Series of nothing, or at a zero window, is not empty")
	}
}

func TestBacktestScores(t *testing.T) {
	// constant predicts the last value: over 1, 2, 4, 4 with warm 1 and
	// h 1 it predicts 1, 2, 4 against 2, 4, 4.
	s := Backtest(mustNew(t, "constant"), []float64{1, 2, 4, 4}, 1, 1)
	want := Score{MAE: 1, RMSE: math.Sqrt(5.0 / 3), MAPE: (0.5 + 0.5) / 3, Under: 2.0 / 3, N: 3}
	if math.Abs(s.MAE-want.MAE) > 1e-12 || math.Abs(s.RMSE-want.RMSE) > 1e-12 || math.Abs(s.MAPE-want.MAPE) > 1e-12 ||
		math.Abs(s.Under-want.Under) > 1e-12 || s.N != want.N {
		t.Errorf("Backtest = %+v, want %+v", s, want)
	}
}

func TestExtremeSeriesPredictFiniteValues(t *testing.T) {
	for _, spec := range All(5) {
		for _, scale := range []float64{1e300, 1e-300} {
			p := mustNew(t, spec)
			for i := range 60 {
				p.Observe(scale * float64(i%3))
			}
			if v := p.Predict(3); math.IsNaN(v) || v < 0 || math.IsInf(v, 0) {
				t.Errorf("%s on a series of scale %v: Predict(3) = %v", spec, scale, v)
			}
		}
	}
}

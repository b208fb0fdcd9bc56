package scrape

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

// exposition serves a recorded /metrics file of testdata, or fails.
type exposition struct {
	mu   sync.Mutex
	file string // "" answers 500
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	file := e.file
	e.mu.Unlock()
	if file == "" {
		http.Error(w, "down", http.StatusInternalServerError)
		return
	}
	b, err := os.ReadFile("testdata/" + file)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write(b)
}

func (e *exposition) serve(file string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.file = file
}

var at = time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)

// TestFrontendScrapesCounterDeltas walks a frontend's recorded exposition
// through load, idleness, a failed scrape and a restart: each window is
// the counters' deltas, an idle one is zeros with undefined means (never
// NaN), a failure is an error with OK false, and a counter that went
// backwards counts from zero.
func TestFrontendScrapesCounterDeltas(t *testing.T) {
	e := &exposition{file: "busy1.prom"}
	srv := httptest.NewServer(e)
	defer srv.Close()
	f := &Frontend{URL: srv.URL + "/metrics"}
	ctx := context.Background()
	scrape := func(i int) (planner.Observation, error) {
		return f.Scrape(ctx, at.Add(time.Duration(i)*30*time.Second))
	}

	if _, err := scrape(0); !errors.Is(err, ErrBaseline) {
		t.Fatalf("the first scrape: %v, want ErrBaseline", err)
	}
	e.serve("busy2.prom")
	o, err := scrape(1)
	if err != nil {
		t.Fatal(err)
	}
	want := planner.Observation{Start: at, End: at.Add(30 * time.Second), OK: true, Arrivals: 60, Finished: 55,
		PromptTokens: 120000, CachedTokens: 30000, OutputTokens: 13000,
		TTFT: planner.Mean{Sum: 27.5, Count: 55}, ITL: planner.Mean{Sum: 6.5, Count: 13000},
		HitByTier: map[string]float64{"pool": 20000, "dram": 10000}, QueueDepth: 3}
	if !reflect.DeepEqual(o, want) {
		t.Errorf("a busy window:\n got %+v\nwant %+v", o, want)
	}

	e.serve("idle.prom")
	o, err = scrape(2)
	if err != nil {
		t.Fatal(err)
	}
	if o.Arrivals != 0 || o.Finished != 0 || o.PromptTokens != 0 || o.QueueDepth != 0 || !o.OK {
		t.Errorf("an idle window: %+v, want zeros", o)
	}
	if _, ok := o.TTFT.Value(); ok {
		t.Errorf("an idle window's TTFT is defined: %+v", o.TTFT)
	}
	checkNumbers(t, o)

	e.serve("")
	o, err = scrape(3)
	if !errors.Is(err, ErrScrape) || o.OK {
		t.Errorf("a failed scrape: %+v, %v; want ErrScrape, OK false", o, err)
	}

	e.serve("reset.prom") // the frontend restarted
	o, err = scrape(4)
	if err != nil {
		t.Fatal(err)
	}
	if o.Arrivals != 12 || o.Finished != 10 || o.PromptTokens != 24000 || o.TTFT != (planner.Mean{Sum: 4, Count: 10}) {
		t.Errorf("after a restart: %+v; want the new counts from zero: 12 arrivals, 10 finished, 24000 prompt tokens", o)
	}
	if !o.Start.Equal(at.Add(60*time.Second)) || !o.End.Equal(at.Add(120*time.Second)) {
		t.Errorf("the window after a failed scrape is [%v, %v), want it from the last good scrape", o.Start, o.End)
	}
	if o.QueueDepth != 0 {
		t.Errorf("a NaN queue depth read as %v, want 0", o.QueueDepth)
	}
	checkNumbers(t, o)
}

// checkNumbers fails on a NaN or an infinity anywhere in o.
func checkNumbers(t *testing.T, o planner.Observation) {
	t.Helper()
	vs := []float64{o.Arrivals, o.Finished, o.PromptTokens, o.CachedTokens, o.OutputTokens, o.TTFT.Sum, o.TTFT.Count,
		o.ITL.Sum, o.ITL.Count, o.QueueDepth}
	for _, v := range o.HitByTier {
		vs = append(vs, v)
	}
	for _, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("%v in %+v", v, o)
		}
	}
}

package scrape

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/perf"
)

// fixedPool is a deployment of one aggregated pool that never changes.
type fixedPool int

func (f fixedPool) Replicas(context.Context) (map[planner.Pool]planner.Replicas, error) {
	return map[planner.Pool]planner.Replicas{planner.Aggregated: {Desired: int(f), Ready: int(f)}}, nil
}
func (fixedPool) Scale(context.Context, planner.Pool, int) error { return nil }

// TestFrontendRestartFeedsThePlannerItsNewCounts: scraped windows drive a
// planner through a frontend restart: the window after it is the new
// counts (a positive rate, not a negative one or a spike of the old
// totals), and nothing in the status is NaN.
func TestFrontendRestartFeedsThePlannerItsNewCounts(t *testing.T) {
	e := &exposition{file: "busy1.prom"}
	srv := httptest.NewServer(e)
	defer srv.Close()
	m, err := perf.New(sim.DefaultProfile(), sim.WorkerLimits{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := planner.New(planner.Config{Mode: planner.ModeAdvisory, TTFT: 2 * time.Second, ITL: 50 * time.Millisecond,
		Pools: map[planner.Pool]planner.Limits{planner.Aggregated: {Min: 1, Max: 8}}, Predictor: "constant"}, m, fixedPool(2), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &Frontend{URL: srv.URL}
	ctx := context.Background()
	rates := map[string]float64{}
	for i, file := range []string{"busy1.prom", "busy2.prom", "idle.prom", "reset.prom"} {
		e.serve(file)
		obs, err := f.Scrape(ctx, at.Add(time.Duration(i)*30*time.Second))
		if i == 0 {
			continue // the baseline
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Step(ctx, obs); err != nil {
			t.Fatal(err)
		}
		s := p.Status()
		if _, err := json.Marshal(s); err != nil {
			t.Fatalf("after %s the status does not encode: %v", file, err)
		}
		rates[file] = s.ObservedRate
	}
	if rates["busy2.prom"] != 2 || rates["idle.prom"] != 0 || rates["reset.prom"] != 12.0/30 {
		t.Errorf("observed rates %v; want 2/s busy, 0 idle, 0.4/s after the restart", rates)
	}
}

package scrape

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvstrata/kvstrata/internal/freeport"
	"github.com/kvstrata/kvstrata/planner"
)

// fakeFrontend serves the frontend's planner series from a registry, as
// router/frontend registers them, and makes traffic on demand.
type fakeFrontend struct {
	arrivals, prompt, cached, finished prometheus.Counter
	prefix                             *prometheus.CounterVec
	ttft, itl, output                  prometheus.Histogram
	queue                              prometheus.Gauge
	srv                                *httptest.Server
}

func newFakeFrontend(t *testing.T) *fakeFrontend {
	reg := prometheus.NewRegistry()
	c := func(name string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: name})
	}
	h := func(name string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: name})
	}
	f := &fakeFrontend{arrivals: c(Arrivals), prompt: c(PromptTokens), cached: c(CachedTokens), finished: c(Finished),
		prefix: prometheus.NewCounterVec(prometheus.CounterOpts{Name: PrefixTokens, Help: "p"}, []string{"tier"}),
		ttft:   h(TTFT), itl: h(ITL), output: h(OutputLengths),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{Name: QueueDepth, Help: "q"})}
	reg.MustRegister(f.arrivals, f.prompt, f.cached, f.finished, f.prefix, f.ttft, f.itl, f.output, f.queue)
	f.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(f.srv.Close)
	return f
}

// request is one request of 1000 prompt tokens, 250 of them cached (200
// in the DRAM tier), 100 output tokens, a TTFT of 0.25 s and an ITL of
// 20 ms.
func (f *fakeFrontend) request() {
	f.arrivals.Inc()
	f.prompt.Add(1000)
	f.cached.Add(250)
	f.prefix.WithLabelValues("dram").Add(200)
	f.finished.Inc()
	f.ttft.Observe(0.25)
	f.itl.Observe(0.02)
	f.output.Observe(100)
}

// startPrometheus runs a Prometheus server that scrapes target every
// second, and returns its URL.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("no prometheus binary (Debian package prometheus): the Prometheus API interop test needs one")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: frontend
    static_configs: [{targets: [%q]}]
`, target)), 0o644)
	addr := freeport.Addr(t)
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(url + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s:\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAPIReadsARealPrometheus: a real Prometheus server scrapes a
// frontend's series; the API scraper reads windows of traffic from it
// (counts, lengths, means and tiers through increase()), an idle window
// as zeros, and a selector matching nothing as ErrNoData.
func TestAPIReadsARealPrometheus(t *testing.T) {
	f := newFakeFrontend(t)
	prom := startPrometheus(t, strings.TrimPrefix(f.srv.URL, "http://"))
	a := &API{URL: prom, Window: 5 * time.Second, Selector: `job="frontend"`}
	ctx := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond) // 20 requests a second
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				f.request()
			case <-stop:
				return
			}
		}
	})
	waitObs := func(what string, done func(o obsErr) bool) obsErr {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			o, err := a.Scrape(ctx, time.Now())
			if done(obsErr{o, err}) {
				return obsErr{o, err}
			}
			if time.Now().After(deadline) {
				close(stop)
				t.Fatalf("%s: not after 60 s; last %+v, %v", what, o, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	busy := waitObs("a window full of traffic", func(r obsErr) bool { return r.err == nil && r.o.Arrivals > 50 })
	o := busy.o
	close(stop)
	wg.Wait()
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > 0.02*want {
			t.Errorf("%s = %v, want %v (±2 %%)", name, got, want)
		}
	}
	if !o.OK || o.Arrivals > 300 {
		t.Errorf("a busy window: %+v; want OK and about 100 arrivals", o)
	}
	near("ISL", o.PromptTokens/o.Arrivals, 1000)
	near("hit", o.CachedTokens/o.PromptTokens, 0.25)
	near("OSL", o.OutputTokens/o.Finished, 100)
	ttft, _ := o.TTFT.Value()
	near("TTFT", ttft, 0.25)
	itl, _ := o.ITL.Value()
	near("ITL", itl, 0.02)
	near("DRAM hits", o.HitByTier["dram"]/o.Arrivals, 200)
	checkNumbers(t, o)

	idle := waitObs("an idle window", func(r obsErr) bool { return r.err == nil && r.o.Arrivals == 0 })
	if _, ok := idle.o.TTFT.Value(); ok || !idle.o.OK {
		t.Errorf("an idle window: %+v; want OK, no TTFT", idle.o)
	}
	checkNumbers(t, idle.o)

	none := &API{URL: prom, Window: 5 * time.Second, Selector: `job="elsewhere"`}
	if o, err := none.Scrape(ctx, time.Now()); !errors.Is(err, ErrNoData) || o.OK {
		t.Errorf("a selector matching nothing: %+v, %v; want ErrNoData, OK false", o, err)
	}
	down := &API{URL: "http://" + freeport.Addr(t), Window: 5 * time.Second}
	if _, err := down.Scrape(ctx, time.Now()); !errors.Is(err, ErrScrape) {
		t.Errorf("no server: %v, want ErrScrape", err)
	}
}

type obsErr struct {
	o   planner.Observation
	err error
}

// TestAPINaNIsZero: a server answering NaN, or nothing, for a series
// other than the arrivals gives zeros, never a NaN.
func TestAPINaNIsZero(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.FormValue("query")
		switch {
		case strings.Contains(q, Arrivals):
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0"]}]}}`)
		case strings.Contains(q, TTFT):
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"NaN"]}]}}`)
		default:
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[]}}`)
		}
	}))
	defer srv.Close()
	o, err := (&API{URL: srv.URL, Window: time.Minute}).Scrape(context.Background(), at)
	if err != nil || !o.OK || o.Arrivals != 0 || o.TTFT != (planner.Mean{}) {
		t.Errorf("%+v, %v; want an OK idle window", o, err)
	}
	checkNumbers(t, o)
}

package scrape

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/planner"
)

// API reads a window from a Prometheus server's HTTP API
// (/api/v1/query), which scrapes the frontend: each count is
// increase(counter[window]) summed over the frontend's series.
type API struct {
	// URL is the server, e.g. http://127.0.0.1:9090.
	URL string
	// Window is the range of the increases, the planner's interval. The
	// server must scrape the frontend at least twice within it.
	Window time.Duration
	// Selector narrows every series, e.g. `job="frontend"`; empty is all.
	Selector string
	// Client does the requests; nil is http.DefaultClient.
	Client *http.Client
	// Lag is how far before now the window ends. A scrape's samples carry
	// its start time but reach the server's queries only when it ends, so
	// a window ending at now would be read by one query before the last
	// scrape landed and by the next after: counts and their token sums
	// would disagree. The default is DefaultLag; it must exceed the
	// server's scrape duration.
	Lag time.Duration
}

// DefaultLag is API.Lag's default.
const DefaultLag = 5 * time.Second

// Scrape reads the window that ends Lag before now, every query at that
// one instant. No arrivals series in the window is ErrNoData, a failed
// query an error wrapping ErrScrape; either way the window is OK false.
// Other series absent or NaN are zeros.
func (a *API) Scrape(ctx context.Context, now time.Time) (planner.Observation, error) {
	lag := a.Lag
	if lag == 0 {
		lag = DefaultLag
	}
	now = now.Add(-lag)
	o := planner.Observation{Start: now.Add(-a.Window), End: now}
	inc := func(name string) (float64, bool, error) {
		r, err := a.query(ctx, now, fmt.Sprintf("sum(increase(%s[%s]))", a.series(name), promDuration(a.Window)))
		if err != nil || len(r) == 0 {
			return 0, false, err
		}
		return r[0].v, true, nil
	}
	arrivals, ok, err := inc(Arrivals)
	if err != nil {
		return o, err
	}
	if !ok {
		return o, fmt.Errorf("%w: %s has no %s over the last %v", ErrNoData, a.URL, a.series(Arrivals), a.Window)
	}
	o.Arrivals = arrivals
	for _, f := range []struct {
		name string
		to   *float64
	}{
		{Finished, &o.Finished}, {PromptTokens, &o.PromptTokens}, {CachedTokens, &o.CachedTokens},
		{OutputLengths + "_sum", &o.OutputTokens},
		{TTFT + "_sum", &o.TTFT.Sum}, {TTFT + "_count", &o.TTFT.Count},
		{ITL + "_sum", &o.ITL.Sum}, {ITL + "_count", &o.ITL.Count},
	} {
		if *f.to, _, err = inc(f.name); err != nil {
			return o, err
		}
	}
	tiers, err := a.query(ctx, now, fmt.Sprintf("sum by (tier) (increase(%s[%s]))", a.series(PrefixTokens), promDuration(a.Window)))
	if err != nil {
		return o, err
	}
	for _, t := range tiers {
		if o.HitByTier == nil {
			o.HitByTier = map[string]float64{}
		}
		o.HitByTier[t.tier] += t.v
	}
	q, err := a.query(ctx, now, fmt.Sprintf("sum(%s)", a.series(QueueDepth)))
	if err != nil {
		return o, err
	}
	if len(q) > 0 {
		o.QueueDepth = q[0].v
	}
	o.OK = true
	return o, nil
}

func (a *API) series(name string) string {
	if a.Selector == "" {
		return name
	}
	return name + "{" + a.Selector + "}"
}

// promDuration is d in PromQL's syntax, in milliseconds.
func promDuration(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// point is one element of an instant vector.
type point struct {
	tier string
	v    float64
}

// query runs an instant query at t and returns its vector, NaN and
// infinite values as zeros.
func (a *API) query(ctx context.Context, t time.Time, q string) ([]point, error) {
	form := url.Values{"query": {q}, "time": {strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(a.URL, "/")+"/api/v1/query", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrScrape, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	c := a.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrScrape, a.URL, err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("%w: %s: %s: %v", ErrScrape, a.URL, resp.Status, err)
	}
	if body.Status != "success" || body.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%w: %s: query %s: %s %s (%s)", ErrScrape, a.URL, q, body.Status, body.Error, body.Data.ResultType)
	}
	var out []point
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64) // "NaN", "+Inf" parse
		if err != nil {
			return nil, fmt.Errorf("%w: %s: query %s: value %q", ErrScrape, a.URL, q, s)
		}
		out = append(out, point{tier: r.Metric["tier"], v: number(v)})
	}
	return out, nil
}

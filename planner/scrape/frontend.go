package scrape

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvstrata/kvstrata/planner"
)

// Frontend scrapes a frontend's /metrics.
type Frontend struct {
	// URL is the metrics endpoint, e.g. http://127.0.0.1:8000/metrics.
	URL string
	// Client does the requests; nil is http.DefaultClient. Its timeout,
	// or the context's, bounds a scrape.
	Client *http.Client

	prev snapshot
	at   time.Time
}

// Scrape reads the metrics at now and returns the window since the last
// successful scrape. The first returns ErrBaseline; a failed one an error
// wrapping ErrScrape, with the window OK false, and the next successful
// one covers the whole time since the last that succeeded.
func (f *Frontend) Scrape(ctx context.Context, now time.Time) (planner.Observation, error) {
	cur, err := f.get(ctx)
	if err != nil {
		return planner.Observation{Start: f.at, End: now}, fmt.Errorf("%w: %s: %v", ErrScrape, f.URL, err)
	}
	prev, start := f.prev, f.at
	f.prev, f.at = cur, now
	if prev == nil {
		return planner.Observation{Start: now, End: now}, ErrBaseline
	}
	return observe(prev, cur, start, now), nil
}

func (f *Frontend) get(ctx context.Context) (snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	c := f.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	return parse(io.LimitReader(resp.Body, 64<<20))
}

// sample is one number of a scrape: a series' value, or a histogram's
// _sum or _count.
type sample struct {
	name, tier string
	part       string // "", "sum" or "count"
	v          float64
	gauge      bool
}

// snapshot is a scrape's samples by series key.
type snapshot map[string]sample

// parse reads the text exposition format.
func parse(r io.Reader) (snapshot, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	s := snapshot{}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			key, tier := seriesKey(name, m.GetLabel())
			put := func(part string, v float64, gauge bool) {
				s[key+"\xff"+part] = sample{name: name, tier: tier, part: part, v: v, gauge: gauge}
			}
			switch {
			case m.Histogram != nil:
				put("sum", m.GetHistogram().GetSampleSum(), false)
				put("count", float64(m.GetHistogram().GetSampleCount()), false)
			case m.Counter != nil:
				put("", m.GetCounter().GetValue(), false)
			case m.Gauge != nil:
				put("", m.GetGauge().GetValue(), true)
			case m.Untyped != nil:
				put("", m.GetUntyped().GetValue(), false)
			}
		}
	}
	return s, nil
}

func seriesKey(name string, labels []*dto.LabelPair) (key, tier string) {
	parts := []string{name}
	for _, l := range labels {
		parts = append(parts, l.GetName()+"="+l.GetValue())
		if l.GetName() == "tier" {
			tier = l.GetValue()
		}
	}
	slices.Sort(parts[1:])
	return strings.Join(parts, "\xfe"), tier
}

// observe is the window [start, end) between two scrapes. A series'
// delta is its increase, or its whole value when it went backwards (the
// frontend restarted and counts from zero) or is new.
func observe(prev, cur snapshot, start, end time.Time) planner.Observation {
	o := planner.Observation{Start: start, End: end, OK: true}
	for key, c := range cur {
		v := number(c.v)
		if !c.gauge {
			if p, ok := prev[key]; ok && number(p.v) <= v {
				v -= number(p.v)
			}
		}
		switch {
		case c.name == Arrivals:
			o.Arrivals += v
		case c.name == Finished:
			o.Finished += v
		case c.name == PromptTokens:
			o.PromptTokens += v
		case c.name == CachedTokens:
			o.CachedTokens += v
		case c.name == PrefixTokens:
			if o.HitByTier == nil {
				o.HitByTier = map[string]float64{}
			}
			o.HitByTier[c.tier] += v
		case c.name == OutputLengths && c.part == "sum":
			o.OutputTokens += v
		case c.name == TTFT:
			addMean(&o.TTFT, c.part, v)
		case c.name == ITL:
			addMean(&o.ITL, c.part, v)
		case c.name == QueueDepth:
			o.QueueDepth += v
		}
	}
	return o
}

func addMean(m *planner.Mean, part string, v float64) {
	switch part {
	case "sum":
		m.Sum += v
	case "count":
		m.Count += v
	}
}

package replay

import (
	"sort"
	"time"

	"github.com/kvstrata/kvstrata/loadgen"
	"github.com/kvstrata/kvstrata/trace"
)

// Report is what a replay measured. Its JSON form is kvctl replay's -o json
// output, part of kvctl's interface: the names below are stable.
type Report struct {
	// Requests is the number scheduled; Sent were sent (fewer only when
	// the replay was stopped); Completed ended with [DONE]; Failed did
	// not, by kind in Errors.
	Requests  int `json:"requests"`
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// Speedup and MaxInFlight are the schedule's; Waited counts requests
	// that found MaxInFlight requests outstanding at their time and were
	// sent late.
	Speedup     float64 `json:"speedup"`
	MaxInFlight int     `json:"max_in_flight"`
	Waited      int     `json:"waited_for_slot"`
	// DurationS is from the first send to the last request's end, in
	// seconds of wall time.
	DurationS float64 `json:"duration_s"`
	// RequestsPerS counts completed requests, OutputTokensPerS their
	// output tokens, over DurationS.
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// Token counts of the completed requests, as their usage says.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// ExpectedOutputTokens is the sum of output_length of the completed
	// requests; OutputTokens falls short of it when a target stops early.
	ExpectedOutputTokens int64 `json:"expected_output_tokens"`
	// PrefixHitRate is CachedTokens / PromptTokens: the share of prompt
	// tokens the target did not compute. It is the total over every
	// place the target found them; per tier it is not reported, because
	// the usage of an OpenAI-compatible server does not say (kvstrata's
	// workers report onboarded tokens in their metrics only).
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// Latencies of the completed requests, in seconds: TTFT from send to
	// the first token, ITL between tokens (see Result.ITL), E2E from send
	// to the end of the stream.
	TTFT Latency `json:"ttft_s"`
	ITL  Latency `json:"itl_s"`
	E2E  Latency `json:"e2e_s"`
	// Errors counts failed requests by kind: "connect", "timeout",
	// "stream_broken", "stream_error", "http_NNN"; FirstError is the
	// first failure's message.
	Errors     map[string]int `json:"errors"`
	FirstError string         `json:"first_error,omitempty"`
}

// Latency summarizes latencies in seconds; quantiles are good to 0.8 %
// (loadgen.Histogram).
type Latency struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func latencyOf(h *loadgen.Histogram) Latency {
	return Latency{Count: int64(h.Count()), Mean: h.Mean().Seconds(), P50: h.Quantile(0.5).Seconds(),
		P90: h.Quantile(0.9).Seconds(), P99: h.Quantile(0.99).Seconds(), Max: h.Max().Seconds()}
}

func newReport(reqs []trace.Request, results []Result, sent []bool, elapsed time.Duration) *Report {
	rep := &Report{Requests: len(reqs), Errors: map[string]int{}, DurationS: elapsed.Seconds()}
	var ttft, itl, e2e loadgen.Histogram
	firstAt := time.Time{}
	for i, r := range results {
		if !sent[i] {
			continue
		}
		rep.Sent++
		if r.ErrKind != "" {
			rep.Failed++
			rep.Errors[r.ErrKind]++
			if rep.FirstError == "" || r.Sent.Before(firstAt) {
				firstAt = r.Sent
				rep.FirstError = r.ErrKind
				if r.Err != nil {
					rep.FirstError += ": " + r.Err.Error()
				}
			}
			continue
		}
		rep.Completed++
		rep.PromptTokens += r.PromptTokens
		rep.CachedTokens += r.CachedTokens
		rep.OutputTokens += r.OutputTokens
		rep.ExpectedOutputTokens += reqs[i].OutputLength
		ttft.Record(r.TTFT)
		e2e.Record(r.E2E)
		for _, d := range r.ITL {
			itl.Record(d)
		}
	}
	if rep.PromptTokens > 0 {
		rep.PrefixHitRate = float64(rep.CachedTokens) / float64(rep.PromptTokens)
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.RequestsPerS = float64(rep.Completed) / s
		rep.OutputTokensPerS = float64(rep.OutputTokens) / s
	}
	rep.TTFT, rep.ITL, rep.E2E = latencyOf(&ttft), latencyOf(&itl), latencyOf(&e2e)
	return rep
}

// ErrorKinds returns the kinds in Errors, sorted.
func (r *Report) ErrorKinds() []string {
	kinds := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	return kinds
}

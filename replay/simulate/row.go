package simulate

import (
	"time"

	"github.com/kvstrata/kvstrata/replay"
)

// Row is one policy's outcome. Its JSON form is a row of `kvctl replay
// --simulate -o json`, part of kvctl's interface: the names are stable.
// Latencies are in seconds of virtual time, over the completed requests.
type Row struct {
	Router string `json:"router"`
	// Scaler is what sized the workers: a NamedScaler's name, or
	// "static:N" for N workers all along.
	Scaler string `json:"scaler"`
	// Cache is CacheKVStrata for a run with the modelled kvstrata cache,
	// CacheNone for a baseline (Config.Baselines) without it.
	Cache string `json:"cache"`

	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`

	TTFTMeanS float64 `json:"ttft_mean_s"`
	TTFTP50S  float64 `json:"ttft_p50_s"`
	TTFTP99S  float64 `json:"ttft_p99_s"`
	ITLMeanS  float64 `json:"itl_mean_s"`
	ITLP99S   float64 `json:"itl_p99_s"`
	E2EMeanS  float64 `json:"e2e_mean_s"`
	E2EP99S   float64 `json:"e2e_p99_s"`

	// PromptTokens is the completed requests' prompt tokens; HitTokensByTier
	// the ones not computed, by where they came from: "hbm", the worker's
	// own pool (as its usage counts them, at the request's first
	// admission), and "dram", "ssd", "s3", restored from that cache tier
	// (every restore, a preempted request's again included).
	PromptTokens    int64            `json:"prompt_tokens"`
	HitTokensByTier map[string]int64 `json:"hit_tokens_by_tier"`
	// PrefixHitRate is the completed requests' cached tokens over their
	// prompt tokens, as the workers' usage says.
	PrefixHitRate float64 `json:"prefix_hit_rate"`

	// QueuedRequests waited for a worker that was not busy (every one
	// was, by the router's busy thresholds) and QueueWaitMeanS is the mean
	// wait of those; the wait is part of their TTFT.
	QueuedRequests int     `json:"queued_requests"`
	QueueWaitMeanS float64 `json:"queue_wait_mean_s"`
	// Preemptions is the workers' preemptions; CacheTimeouts the
	// onboardings cut short by the cache timeout.
	Preemptions   uint64 `json:"preemptions"`
	CacheTimeouts int64  `json:"cache_timeouts"`
	// OffloadedBlocks is the blocks the cache stored; RejectedBlocks those
	// it had no room for.
	OffloadedBlocks int64 `json:"offloaded_blocks"`
	RejectedBlocks  int64 `json:"rejected_blocks"`

	// DurationS is the virtual time from the first arrival to the last
	// request's end; RequestsPerS and OutputTokensPerS are over it.
	DurationS        float64 `json:"duration_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// SLOAttainment is the share of requests within Config.SLO (failed
	// ones are misses).
	SLOAttainment float64 `json:"slo_attainment"`
	// WorkerSeconds is every worker's virtual time from its add (start-up
	// included) to its retirement or the end of the run; WorkersMean is
	// it over DurationS, WorkersMax the most workers held at once
	// (starting, serving and draining).
	WorkerSeconds float64 `json:"worker_seconds"`
	WorkersMax    int     `json:"workers_max"`
	WorkersMean   float64 `json:"workers_mean"`
	// ScaleUps and ScaleDowns count the scaler's ticks that added and
	// that removed workers.
	ScaleUps   int `json:"scale_ups"`
	ScaleDowns int `json:"scale_downs"`

	// WallS is the wall-clock time the simulation of this policy took.
	WallS float64 `json:"wall_s"`

	// Errors counts failed requests by kind ("rejected": a worker refused
	// it, e.g. longer than its context; "abort"); FirstError is the
	// first's message.
	Errors     map[string]int `json:"errors,omitempty"`
	FirstError string         `json:"first_error,omitempty"`
}

// Row.Cache's values.
const (
	CacheKVStrata = "kvstrata"
	CacheNone     = "none"
)

// row summarizes the run.
func (r *run) row(wall time.Duration) Row {
	rep := replay.Summarize(r.reqs, r.results, r.now.Sub(epoch))
	row := Row{
		Router:    r.pol.String(),
		Scaler:    r.scalerName,
		Cache:     CacheNone,
		Requests:  rep.Requests,
		Completed: rep.Completed,
		Failed:    rep.Failed,
		TTFTMeanS: rep.TTFT.Mean, TTFTP50S: rep.TTFT.P50, TTFTP99S: rep.TTFT.P99,
		ITLMeanS: rep.ITL.Mean, ITLP99S: rep.ITL.P99,
		E2EMeanS: rep.E2E.Mean, E2EP99S: rep.E2E.P99,
		PromptTokens:     rep.PromptTokens,
		HitTokensByTier:  map[string]int64{"hbm": r.hbmTokens},
		PrefixHitRate:    rep.PrefixHitRate,
		QueuedRequests:   r.queued,
		DurationS:        rep.DurationS,
		RequestsPerS:     rep.RequestsPerS,
		OutputTokensPerS: rep.OutputTokensPerS,
		WallS:            wall.Seconds(),
		FirstError:       rep.FirstError,
	}
	for i, name := range tierNames {
		row.HitTokensByTier[name] = 0
		if r.cache != nil {
			row.HitTokensByTier[name] = r.cache.hitTokens[i]
		}
	}
	if r.cache != nil {
		row.Cache = CacheKVStrata
		row.CacheTimeouts, row.OffloadedBlocks, row.RejectedBlocks = r.cache.timeouts, r.cache.offloaded, r.cache.rejected
	}
	if r.queued > 0 {
		row.QueueWaitMeanS = (r.queueWait / time.Duration(r.queued)).Seconds()
	}
	if len(rep.Errors) > 0 {
		row.Errors = rep.Errors
	}
	for _, w := range r.workers {
		if w.eng != nil {
			row.Preemptions += w.eng.Stats().Preemptions
		} else {
			row.Preemptions += w.preemptions
		}
	}
	row.SLOAttainment = r.attainment()
	row.WorkerSeconds = r.workerSeconds()
	if d := r.now.Sub(epoch).Seconds(); d > 0 {
		row.WorkersMean = row.WorkerSeconds / d
	}
	row.WorkersMax, row.ScaleUps, row.ScaleDowns = r.heldMax, r.scaleUps, r.scaleDowns
	return row
}

// attainment is the share of requests within the SLO (Config.SLO).
func (r *run) attainment() float64 {
	if len(r.results) == 0 {
		return 0
	}
	slo := r.cfg.SLO
	within := 0
	for _, res := range r.results {
		if res.ErrKind != "" {
			continue
		}
		alone := r.perf.PrefillTime(float64(res.PromptTokens - res.CachedTokens))
		if float64(res.TTFT) > max(float64(slo.TTFT), slo.TTFTSlack*float64(alone)) {
			continue
		}
		if n := len(res.ITL); n > 0 {
			var sum time.Duration
			for _, g := range res.ITL {
				sum += g
			}
			if sum/time.Duration(n) > slo.ITL {
				continue
			}
		}
		within++
	}
	return float64(within) / float64(len(r.results))
}

package frontend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// Causes of a migration, the label of kvstrata_frontend_migrations_total.
const (
	causeRefused    = "refused"    // no connection, or none in time
	causeStatus     = "status"     // the worker answered 5xx
	causeBroken     = "broken"     // the stream broke before its end
	causeOverloaded = "overloaded" // the worker answered 503: its queue is full
)

// workerRequest is the body sent to a worker's /v1/completions.
type workerRequest struct {
	Model            string                  `json:"model,omitempty"`
	Prompt           []uint32                `json:"prompt"`
	MaxTokens        int                     `json:"max_tokens"`
	Temperature      float64                 `json:"temperature"`
	Seed             int64                   `json:"seed"`
	StopTokenIDs     []uint32                `json:"stop_token_ids,omitempty"`
	IgnoreEOS        bool                    `json:"ignore_eos,omitempty"`
	Stream           bool                    `json:"stream"`
	StreamOptions    map[string]bool         `json:"stream_options"`
	ReturnTokenIDs   bool                    `json:"return_token_ids"`
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params,omitempty"`
}

// workerChunk is one streamed chunk of a worker's answer.
type workerChunk struct {
	Choices []struct {
		TokenIDs     []uint32 `json:"token_ids"`
		FinishReason *string  `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params"`
	Error            *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// attempt is how one worker's stream ended.
type attempt struct {
	finish   sched.FinishReason // set when the worker finished the request
	last     []uint32           // the tokens of the finishing chunk
	cached   int
	transfer *sched.KVTransferParams
	cause    string // set when the worker failed: the request may move
	err      error  // the failure, or an error to end the request with
}

// serve streams the request from its worker to out, moving it to another
// worker when one fails, and ends with the final Output. ov is the
// request's routing override (nil none); route labels its metrics.
func (r *Router) serve(ctx context.Context, req sched.Request, ov *policy.Override, d policy.Decision, route string, arrived time.Time, out chan<- sched.Output) {
	defer close(out)
	var produced []uint32
	prompt := req.Prompt
	first, lastTok := time.Time{}, time.Time{}
	moves := 0
	send := func(o sched.Output) bool {
		select {
		case out <- o:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		w := r.workerSet().byName[d.Worker]
		seq := d.Seq
		firstHere := true
		a := r.stream(ctx, w, req, prompt, req.MaxTokens-len(produced), func(toks []uint32) bool {
			now := time.Now()
			if firstHere {
				seq.FirstToken()
				firstHere = false
			}
			if first.IsZero() {
				first = now
				r.m.ttft.WithLabelValues(w.name, route).Observe(now.Sub(arrived).Seconds())
			} else {
				r.m.itl.WithLabelValues(w.name).Observe(now.Sub(lastTok).Seconds() / float64(len(toks)))
			}
			lastTok = now
			produced = append(produced, toks...)
			return send(sched.Output{Tokens: toks})
		})
		seq.Done()
		r.released()
		if a.finish != "" {
			produced = append(produced, a.last...)
			r.m.requests.WithLabelValues(w.name, "ok", route).Inc()
			r.m.e2e.WithLabelValues(w.name, route).Observe(time.Since(arrived).Seconds())
			r.m.inputLen.WithLabelValues(w.name).Observe(float64(len(req.Prompt)))
			r.m.outputLen.WithLabelValues(w.name).Observe(float64(len(produced)))
			if route != routeDisaggregated { // the decode worker counts the transferred prompt as cached
				r.m.cachedTokens.Add(float64(min(a.cached, len(req.Prompt))))
			}
			send(sched.Output{Tokens: a.last, Finish: a.finish, Transfer: a.transfer, Usage: sched.Usage{
				PromptTokens: len(req.Prompt), CompletionTokens: len(produced), CachedTokens: min(a.cached, len(req.Prompt)),
			}})
			return
		}
		fail := func(err error) {
			outcome := "error"
			if ctx.Err() != nil {
				outcome = "cancelled"
			}
			r.m.requests.WithLabelValues(w.name, outcome, route).Inc()
			send(sched.Output{Finish: sched.FinishAbort, Err: err})
		}
		if a.cause == "" || ctx.Err() != nil {
			fail(a.err)
			return
		}
		r.m.migrations.WithLabelValues(a.cause).Inc()
		if a.cause != causeOverloaded {
			w.down(a.cause, a.err)
		}
		moves++
		if r.cfg.MaxMigrations < 0 || moves > r.cfg.MaxMigrations {
			fail(fmt.Errorf("%w (%d moves; last: %s: %v)", ErrMigrations, moves-1, w.name, a.err))
			return
		}
		if len(produced) >= req.MaxTokens {
			// Every token came; only the end was lost.
			send(sched.Output{Finish: sched.FinishLength, Usage: sched.Usage{PromptTokens: len(req.Prompt), CompletionTokens: len(produced)}})
			return
		}
		prompt = append(slices.Clip(req.Prompt), produced...)
		r.cfg.Logger.Info("frontend: moving a request", "id", req.ID, "from", w.name, "cause", a.cause,
			"produced", len(produced), "err", a.err)
		var err error
		if d, err = r.route(ctx, prompt, ov); err != nil {
			fail(fmt.Errorf("frontend: moving the request from %s (%v): %w", w.name, a.err, err))
			return
		}
	}
}

// stream runs the request on w, prompt being the request's prompt plus
// what other workers produced, and hands each chunk's tokens to emit (but
// the finishing chunk's, returned).
func (r *Router) stream(ctx context.Context, w *worker, req sched.Request, prompt []uint32, maxTokens int, emit func([]uint32) bool) attempt {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	guard := newStallGuard(r.cfg.StallTimeout, r.cfg.StallLimit, r.cfg.HealthInterval, w.healthy.Load, cancel)
	defer guard.stop()
	resp, failed := r.post(actx, w, workerRequest{
		Model: r.cfg.WorkerModel, Prompt: prompt, MaxTokens: maxTokens,
		Temperature: req.Sampling.Temperature, Seed: int64(req.Sampling.Seed),
		StopTokenIDs: req.StopTokens, IgnoreEOS: req.IgnoreEOS, Stream: true,
		StreamOptions: map[string]bool{"include_usage": true}, ReturnTokenIDs: true, KVTransferParams: req.Transfer,
	})
	if resp == nil {
		if ctx.Err() == nil {
			if serr := guard.stalled(w.name); serr != nil {
				return attempt{cause: causeStalled, err: serr}
			}
		}
		return failed
	}
	defer resp.Body.Close()
	var a attempt
	sc := bufio.NewScanner(guard.body(resp.Body))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			if a.finish == "" {
				return attempt{cause: causeBroken, err: errors.New("the stream ended without a finish reason")}
			}
			return a
		}
		var c workerChunk
		if err := json.Unmarshal(data, &c); err != nil {
			return attempt{cause: causeBroken, err: fmt.Errorf("a chunk is not JSON: %v", err)}
		}
		if c.Error != nil {
			return attempt{cause: causeStatus, err: fmt.Errorf("worker %s failed the request: %s", w.name, c.Error.Message)}
		}
		if c.Usage != nil && c.Usage.PromptTokensDetails != nil {
			a.cached = c.Usage.PromptTokensDetails.CachedTokens
		}
		if c.KVTransferParams != nil {
			a.transfer = c.KVTransferParams
		}
		if len(c.Choices) == 0 || a.finish != "" {
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			a.finish, a.last = sched.FinishReason(*ch.FinishReason), ch.TokenIDs
			continue
		}
		if len(ch.TokenIDs) > 0 {
			guard.hold()
			if !emit(ch.TokenIDs) {
				return attempt{err: ctx.Err()}
			}
			guard.token()
		}
	}
	if ctx.Err() != nil {
		return attempt{err: ctx.Err()}
	}
	if a.finish != "" {
		return a // finished, only [DONE] lost
	}
	if serr := guard.stalled(w.name); serr != nil {
		return attempt{cause: causeStalled, err: serr}
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return attempt{cause: causeBroken, err: fmt.Errorf("the stream from %s broke: %w", w.name, err)}
}

// post sends body to w's /v1/completions and returns its 200 answer, or a
// nil answer and how the attempt failed: a refused connection, a 503 or
// another 5xx (the request may move), or a 4xx (the request's fault).
func (r *Router) post(ctx context.Context, w *worker, body workerRequest) (*http.Response, attempt) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, attempt{err: err}
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, w.spec.URL+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return nil, attempt{err: err}
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := r.http.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, attempt{err: ctx.Err()}
		}
		return nil, attempt{cause: causeRefused, err: err}
	}
	if resp.StatusCode == http.StatusOK {
		return resp, attempt{}
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	err = fmt.Errorf("worker %s answered %s: %s", w.name, resp.Status, bytes.TrimSpace(msg))
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		return nil, attempt{cause: causeOverloaded, err: err}
	case resp.StatusCode >= 500:
		return nil, attempt{cause: causeStatus, err: err}
	default:
		// The request's fault, as the worker sees it.
		return nil, attempt{err: fmt.Errorf("%w: %v", sched.ErrBadRequest, err)}
	}
}

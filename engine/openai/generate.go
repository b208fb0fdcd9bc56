package openai

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// errNoFinal is a request whose output channel closed without a last
// Output: the engine broke its contract.
var errNoFinal = errors.New("openai: the engine ended the request without a final output")

// job is one prompt's engine request.
type job struct {
	index     int
	promptLen int
	// userStops are the request's stop_token_ids: a stop on one of them
	// is reported as the stop_reason.
	userStops []uint32
	// eos are every stop token: their text is not part of the output.
	eos       []uint32
	ignoreEOS bool
	det       *detokenizer
	generated int
	out       <-chan sched.Output
	cancel    context.CancelFunc
}

// piece is what one prompt produced since its previous piece.
type piece struct {
	index int
	text  string
	// tokens are the token ids generated since the previous piece, stop
	// tokens included (return_token_ids reports them as the engine made
	// them), even when their text is held back.
	tokens []uint32
	fin    *finish // set on a prompt's last piece
	// The prompt's tokens, and those generated up to and with this piece.
	prompt, generated int
}

// usageSoFar is the usage of pc's prompt up to pc: its final usage on the
// last piece.
func (pc piece) usageSoFar() *usageJSON {
	u := &usageJSON{}
	if pc.fin != nil {
		u.add(pc.fin.usage)
		return u
	}
	u.add(sched.Usage{PromptTokens: pc.prompt, CompletionTokens: pc.generated})
	return u
}

// finish is how one prompt ended.
type finish struct {
	reason     string // "stop" or "length"
	stopReason any    // the stop string or stop token id, or nil
	usage      sched.Usage
	transfer   *sched.KVTransferParams
	err        error // the request failed
}

// start submits one engine request per prompt under ctx. If one cannot
// start, it cancels those it started and returns the error's answer.
func (s *Server) start(ctx context.Context, id string, prompts [][]uint32, maxTokens []int, p params) ([]*job, *apiError) {
	jobs := make([]*job, 0, len(prompts))
	userStops := p.stopTokens[len(s.cfg.StopTokens):]
	for i, ids := range prompts {
		jctx, cancel := context.WithCancel(ctx)
		req := sched.Request{
			ID:         id,
			Prompt:     ids,
			MaxTokens:  maxTokens[i],
			Sampling:   p.sampling,
			StopTokens: p.stopTokens,
			IgnoreEOS:  p.ignoreEOS,
			Transfer:   p.transfer,
			Routing:    p.routing,
		}
		if len(prompts) > 1 {
			req.ID = fmt.Sprintf("%s-%d", id, i)
		}
		out, err := s.cfg.Engine.Generate(jctx, req)
		if err != nil {
			cancel()
			for _, j := range jobs {
				j.cancel()
			}
			s.logFailure(ctx, "openai: engine refused a request", req.ID, err)
			return nil, engineError(err)
		}
		jobs = append(jobs, &job{
			index: i, promptLen: len(ids), userStops: userStops, eos: p.stopTokens,
			ignoreEOS: p.ignoreEOS, det: newDetokenizer(s.cfg.Tokenizer, p.stop), out: out, cancel: cancel,
		})
	}
	return jobs, nil
}

// merge runs every job and sends their pieces on one channel, which is
// closed once every job has sent its last piece or ctx is done.
func merge(ctx context.Context, jobs []*job) <-chan piece {
	ch := make(chan piece)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer j.cancel()
			j.run(func(pc piece) bool {
				pc.index, pc.prompt, pc.generated = j.index, j.promptLen, j.generated
				select {
				case ch <- pc:
					return true
				case <-ctx.Done():
					return false
				}
			})
		}()
	}
	go func() {
		wg.Wait()
		close(ch)
	}()
	return ch
}

// run reads j's outputs, detokenizes them and emits pieces until the
// request ends or emit fails. A stop string cancels the engine request.
func (j *job) run(emit func(piece) bool) {
	var pending []uint32 // tokens not yet sent in a piece
	for o := range j.out {
		toks := o.Tokens
		j.generated += len(toks)
		pending = append(pending, toks...)
		var stopTok any
		if o.Finish == sched.FinishStop && !j.ignoreEOS && len(toks) > 0 && slices.Contains(j.eos, toks[len(toks)-1]) {
			last := toks[len(toks)-1]
			toks = toks[:len(toks)-1] // a stop token's text is not output
			if slices.Contains(j.userStops, last) {
				stopTok = last
			}
		}
		j.det.add(toks)
		if j.det.stopped {
			j.cancel()
			final := o
			if o.Finish == "" {
				for o := range j.out {
					final = o
				}
			}
			emit(piece{text: j.det.take(true), tokens: pending, fin: &finish{
				reason: "stop", stopReason: j.det.stopString, usage: j.usage(final.Usage), transfer: final.Transfer,
			}})
			return
		}
		if o.Finish == "" {
			if t := j.det.take(false); t != "" || len(pending) > 0 {
				if !emit(piece{text: t, tokens: pending}) {
					return
				}
				pending = nil
			}
			continue
		}
		f := &finish{reason: string(o.Finish), stopReason: stopTok, usage: j.usage(o.Usage), transfer: o.Transfer}
		if o.Finish == sched.FinishAbort {
			f.err = o.Err
			if f.err == nil {
				f.err = errors.New("openai: the engine aborted the request")
			}
		}
		emit(piece{text: j.det.take(true), tokens: pending, fin: f})
		return
	}
	emit(piece{fin: &finish{err: errNoFinal}})
}

// usage is the job's usage: token counts as the server saw them, cached
// tokens as the engine reports them.
func (j *job) usage(engine sched.Usage) sched.Usage {
	return sched.Usage{
		PromptTokens:     j.promptLen,
		CompletionTokens: j.generated,
		CachedTokens:     engine.CachedTokens,
		OnboardedTokens:  engine.OnboardedTokens,
	}
}

// usageJSON is a response's usage, as vLLM's UsageInfo.
type usageJSON struct {
	PromptTokens        int          `json:"prompt_tokens"`
	TotalTokens         int          `json:"total_tokens"`
	CompletionTokens    int          `json:"completion_tokens"`
	PromptTokensDetails *tokenDetail `json:"prompt_tokens_details"`
}

type tokenDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

// add counts u in the usage.
func (u *usageJSON) add(x sched.Usage) {
	u.PromptTokens += x.PromptTokens
	u.CompletionTokens += x.CompletionTokens
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if u.PromptTokensDetails == nil {
		u.PromptTokensDetails = &tokenDetail{}
	}
	u.PromptTokensDetails.CachedTokens += x.CachedTokens
}

// reason is a finish reason as JSON: null until set.
func reason(f *finish) *string {
	if f == nil {
		return nil
	}
	r := f.reason
	return &r
}

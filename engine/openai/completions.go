package openai

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// completion is a /v1/completions response or stream chunk, as vLLM's
// CompletionResponse and CompletionStreamResponse.
type completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usageJSON         `json:"usage,omitempty"`
	// KVTransferParams are the final Output's, at the top level as vLLM
	// returns them (of the first prompt that has some, in a batch).
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params,omitempty"`
}

type completionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	StopReason   any       `json:"stop_reason"`
	// PromptTokenIDs and TokenIDs answer return_token_ids, as vLLM's
	// choices carry them: the prompt's ids (once per choice when
	// streaming) and the generated ids.
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
	TokenIDs       []uint32 `json:"token_ids,omitempty"`
}

// completions serves POST /v1/completions.
func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var req CompletionRequest
	if aerr := decodeBody(body, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	prompts, echoes, maxTokens, p, aerr := s.checkCompletion(&req)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	id := newID("cmpl-")
	jobs, aerr := s.start(ctx, id, prompts, maxTokens, p)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	head := completion{ID: id, Object: "text_completion", Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if p.stream {
		var promptIDs [][]uint32
		if req.ReturnTokenIDs {
			promptIDs = prompts
		}
		s.streamCompletion(ctx, w, head, jobs, echoes, promptIDs, p.includeUsage, p.continuousUsage)
		return
	}
	texts := make([]strings.Builder, len(jobs))
	tokens := make([][]uint32, len(jobs))
	fins := make([]*finish, len(jobs))
	for i := range texts {
		texts[i].WriteString(echoes[i])
	}
	for pc := range merge(ctx, jobs) {
		texts[pc.index].WriteString(pc.text)
		tokens[pc.index] = append(tokens[pc.index], pc.tokens...)
		if f := pc.fin; f != nil {
			if f.err != nil {
				s.logFailure(ctx, "openai: completion failed", id, f.err) // before cancel: a done ctx reads as the client leaving
				cancel()
				writeError(w, engineError(f.err))
				return
			}
			fins[pc.index] = f
		}
	}
	if ctx.Err() != nil {
		return // the client is gone
	}
	resp := head
	resp.Usage = &usageJSON{}
	for i, f := range fins {
		c := completionChoice{Index: i, Text: texts[i].String(), FinishReason: reason(f), StopReason: f.stopReason}
		if req.ReturnTokenIDs {
			c.PromptTokenIDs, c.TokenIDs = prompts[i], tokens[i]
			if c.TokenIDs == nil {
				c.TokenIDs = []uint32{}
			}
		}
		resp.Choices = append(resp.Choices, c)
		resp.Usage.add(f.usage)
		if resp.KVTransferParams == nil {
			resp.KVTransferParams = f.transfer
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// checkCompletion validates a completions request and tokenizes its
// prompts: their ids, their echoed text (empty without echo), and their
// max_tokens.
func (s *Server) checkCompletion(req *CompletionRequest) (prompts [][]uint32, echoes []string, maxTokens []int, p params, aerr *apiError) {
	vocab := s.cfg.Tokenizer.VocabSize()
	if aerr = checkMax("max_tokens", req.MaxTokens); aerr != nil {
		return
	}
	if !isNull(req.Logprobs) {
		aerr = badRequest("logprobs", "logprobs are not supported by this server")
		return
	}
	if p, aerr = req.check(vocab, s.cfg.StopTokens); aerr != nil {
		return
	}
	parsed, aerr := parsePrompts(req.Prompt, vocab, s.cfg.MaxBatchPrompts)
	if aerr != nil {
		return
	}
	if aerr = s.checkModel(req.Model); aerr != nil {
		return
	}
	want := defaultCompletionMaxTokens
	if req.MaxTokens != nil {
		want = *req.MaxTokens
	}
	for _, pr := range parsed {
		ids, echo := pr.ids, ""
		if pr.isText {
			ids = s.cfg.Tokenizer.Encode(pr.text)
			echo = pr.text
		} else if req.Echo {
			echo = s.cfg.Tokenizer.Decode(ids)
		}
		if len(ids) == 0 {
			aerr = badRequest("prompt", "the prompt %.40q encodes to no tokens", pr.text)
			return
		}
		n, e := s.checkLength(len(ids), &want)
		if e != nil {
			aerr = e
			return
		}
		if !req.Echo {
			echo = ""
		}
		prompts, echoes, maxTokens = append(prompts, ids), append(echoes, echo), append(maxTokens, n)
	}
	return
}

// streamCompletion streams the jobs' pieces as completion chunks. With
// promptIDs (return_token_ids), each choice's first chunk carries its
// prompt's ids and every chunk the token ids it adds.
func (s *Server) streamCompletion(ctx context.Context, w http.ResponseWriter, head completion, jobs []*job, echoes []string, promptIDs [][]uint32, includeUsage, continuousUsage bool) {
	out := newSSE(w)
	withIDs := promptIDs != nil
	sentPrompt := make([]bool, len(jobs))
	chunk := func(pc piece) error {
		c := head
		c.Choices = []completionChoice{{Index: pc.index, Text: pc.text, FinishReason: reason(pc.fin)}}
		if pc.fin != nil {
			c.Choices[0].StopReason = pc.fin.stopReason
		}
		if continuousUsage {
			c.Usage = pc.usageSoFar()
		}
		if withIDs {
			if !sentPrompt[pc.index] {
				c.Choices[0].PromptTokenIDs, sentPrompt[pc.index] = promptIDs[pc.index], true
			}
			c.Choices[0].TokenIDs = pc.tokens
		}
		return out.send(c)
	}
	for i, e := range echoes {
		if e != "" && chunk(piece{index: i, text: e, prompt: jobs[i].promptLen}) != nil {
			return
		}
	}
	total, ok := s.streamPieces(ctx, out, head.ID, jobs, func(pc piece) bool { return pc.text != "" || withIDs && len(pc.tokens) > 0 }, chunk)
	if !ok {
		return
	}
	if includeUsage {
		c := head
		c.Choices = []completionChoice{}
		c.Usage = total
		if out.send(c) != nil {
			return
		}
	}
	out.done()
}

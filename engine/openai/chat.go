package openai

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// chatCompletion is a /v1/chat/completions response, as vLLM's
// ChatCompletionResponse.
type chatCompletion struct {
	ID               string                  `json:"id"`
	Object           string                  `json:"object"`
	Created          int64                   `json:"created"`
	Model            string                  `json:"model"`
	Choices          []chatChoice            `json:"choices"`
	Usage            *usageJSON              `json:"usage,omitempty"`
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     *struct{}    `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

type chatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// chat serves POST /v1/chat/completions. The messages become one prompt
// through the configured chat template.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	body, aerr := s.readBody(w, r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var req ChatCompletionRequest
	if aerr := decodeBody(body, &req); aerr != nil {
		writeError(w, aerr)
		return
	}
	ids, maxTokens, p, aerr := s.checkChat(&req)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	id := newID("chatcmpl-")
	jobs, aerr := s.start(ctx, id, [][]uint32{ids}, []int{maxTokens}, p)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	head := chatCompletion{ID: id, Created: time.Now().Unix(), Model: s.cfg.ModelName}
	if p.stream {
		head.Object = "chat.completion.chunk"
		s.streamChat(ctx, w, head, jobs, p.includeUsage, p.continuousUsage)
		return
	}
	head.Object = "chat.completion"
	var text strings.Builder
	var fin *finish
	for pc := range merge(ctx, jobs) {
		text.WriteString(pc.text)
		if pc.fin != nil {
			fin = pc.fin
		}
	}
	if ctx.Err() != nil || fin == nil {
		return // the client is gone
	}
	if fin.err != nil {
		s.logFailure(ctx, "openai: chat completion failed", id, fin.err)
		writeError(w, engineError(fin.err))
		return
	}
	content := text.String()
	resp := head
	resp.Choices = []chatChoice{{Message: &chatMessage{Role: "assistant", Content: &content}, FinishReason: reason(fin), StopReason: fin.stopReason}}
	resp.Usage = &usageJSON{}
	resp.Usage.add(fin.usage)
	resp.KVTransferParams = fin.transfer
	writeJSON(w, http.StatusOK, resp)
}

// checkChat validates a chat request and returns its prompt's ids and
// max_tokens (max_completion_tokens, else max_tokens, else the rest of the
// context, as vLLM).
func (s *Server) checkChat(req *ChatCompletionRequest) (ids []uint32, maxTokens int, p params, aerr *apiError) {
	if aerr = checkMax("max_tokens", req.MaxTokens); aerr != nil {
		return
	}
	if aerr = checkMax("max_completion_tokens", req.MaxCompletionTokens); aerr != nil {
		return
	}
	if !isNull(req.Logprobs) && strings.TrimSpace(string(req.Logprobs)) != "false" {
		aerr = badRequest("logprobs", "logprobs are not supported by this server")
		return
	}
	if t := strings.TrimSpace(string(req.Tools)); !isNull(req.Tools) && t != "[]" {
		aerr = badRequest("tools", "tools are not supported by this server")
		return
	}
	if p, aerr = req.check(s.cfg.Tokenizer.VocabSize(), s.cfg.StopTokens); aerr != nil {
		return
	}
	turns, aerr := parseMessages(req.Messages)
	if aerr != nil {
		return
	}
	if aerr = s.checkModel(req.Model); aerr != nil {
		return
	}
	ids = s.cfg.Tokenizer.Encode(s.cfg.ChatTemplate(turns))
	if len(ids) == 0 {
		aerr = badRequest("messages", "the messages encode to no tokens")
		return
	}
	want := req.MaxCompletionTokens
	if want == nil {
		want = req.MaxTokens
	}
	maxTokens, aerr = s.checkLength(len(ids), want)
	return
}

// streamChat streams the job's pieces as chat chunks: the assistant role
// first, then content deltas, the last with the finish reason.
func (s *Server) streamChat(ctx context.Context, w http.ResponseWriter, head chatCompletion, jobs []*job, includeUsage, continuousUsage bool) {
	out := newSSE(w)
	chunk := func(d chatMessage, pc piece) error {
		c := head
		c.Choices = []chatChoice{{Delta: &d, FinishReason: reason(pc.fin)}}
		if pc.fin != nil {
			c.Choices[0].StopReason = pc.fin.stopReason
		}
		if continuousUsage {
			c.Usage = pc.usageSoFar()
		}
		return out.send(c)
	}
	empty := ""
	if chunk(chatMessage{Role: "assistant", Content: &empty}, piece{prompt: jobs[0].promptLen}) != nil {
		return
	}
	total, ok := s.streamPieces(ctx, out, head.ID, jobs, func(pc piece) bool { return pc.text != "" }, func(pc piece) error {
		text := pc.text
		return chunk(chatMessage{Content: &text}, pc)
	})
	if !ok {
		return
	}
	if includeUsage {
		c := head
		c.Choices = []chatChoice{}
		c.Usage = total
		if out.send(c) != nil {
			return
		}
	}
	out.done()
}

package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// The request bodies, as vLLM's protocol.py reads them. Fields a request
// may carry that the server does not act on are ignored, as vLLM ignores
// extra fields; fields it cannot honour (n > 1, logprobs, tools) are
// refused with a 400 rather than silently dropped.

// StreamOptions are a streaming request's stream_options.
type StreamOptions struct {
	// IncludeUsage adds a last chunk with the usage and no choices. As in
	// vLLM, it is true when stream_options is given without it.
	IncludeUsage *bool `json:"include_usage"`
	// ContinuousUsageStats, with IncludeUsage, puts in every chunk the
	// usage of its choice so far, as vLLM does: a client learns from
	// completion_tokens how many tokens each chunk carries (a token whose
	// text ends mid-character comes with the next chunk).
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

// StopList is the stop field: a string, a list of strings, or null.
type StopList []string

// UnmarshalJSON accepts a string or a list of strings.
func (s *StopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = StopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("stop must be a string or a list of strings")
	}
	*s = many
	return nil
}

// sampling holds the fields completions and chat share.
type sampling struct {
	Model            string                  `json:"model"`
	Temperature      *float64                `json:"temperature"`
	Seed             *int64                  `json:"seed"`
	Stop             StopList                `json:"stop"`
	StopTokenIDs     []int64                 `json:"stop_token_ids"`
	IgnoreEOS        bool                    `json:"ignore_eos"`
	Stream           bool                    `json:"stream"`
	StreamOptions    *StreamOptions          `json:"stream_options"`
	N                *int                    `json:"n"`
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params"`
	// Kvstrata is kvstrata's own extension: the request's routing
	// override, honoured by `kvstrata frontend` (sched.Routing).
	Kvstrata *sched.Routing `json:"kvstrata"`
}

// CompletionRequest is the body of POST /v1/completions.
type CompletionRequest struct {
	sampling
	// Prompt is a string, a list of token ids, or a list of either (a
	// batch: one choice per prompt).
	Prompt    json.RawMessage `json:"prompt"`
	MaxTokens *int            `json:"max_tokens"`
	// Echo puts the prompt's text before each choice's text.
	Echo     bool            `json:"echo"`
	Logprobs json.RawMessage `json:"logprobs"`
	// ReturnTokenIDs adds each choice's token ids, as vLLM ≥ 0.10.2 does:
	// the prompt's (prompt_token_ids, on a stream's first chunk of each
	// choice) and the generated ones (token_ids, on every chunk the ones
	// it adds, stop tokens included).
	ReturnTokenIDs bool `json:"return_token_ids"`
}

// ChatMessage is one message of a chat request.
type ChatMessage struct {
	Role string `json:"role"`
	// Content is a string, null, or a list of parts of type "text".
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

// ChatCompletionRequest is the body of POST /v1/chat/completions.
type ChatCompletionRequest struct {
	sampling
	Messages            []ChatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            json.RawMessage `json:"logprobs"`
	Tools               json.RawMessage `json:"tools"`
}

// params is a validated request, ready for the engine once its prompts
// are tokenized.
type params struct {
	// maxTokens is the request's max_tokens; nil: the rest of the context.
	maxTokens    *int
	sampling     sched.Sampling
	stop         []string
	stopTokens   []uint32
	ignoreEOS    bool
	stream       bool
	includeUsage bool
	// continuousUsage: every streamed chunk carries its choice's usage so
	// far (stream_options.continuous_usage_stats with include_usage).
	continuousUsage bool
	transfer        *sched.KVTransferParams
	routing         *sched.Routing
}

// decodeBody decodes a JSON body into v; a syntax or type error is a 400
// naming the field.
func decodeBody(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return badRequest(te.Field, "%s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		}
		return badRequest("", "invalid JSON body: %v", err)
	}
	return nil
}

// check validates the shared fields against the vocabulary size and the
// server's stop tokens, and returns the params they make.
func (r *sampling) check(vocab int, eos []uint32) (params, *apiError) {
	p := params{
		stream:    r.Stream,
		ignoreEOS: r.IgnoreEOS,
		transfer:  r.KVTransferParams,
		routing:   r.Kvstrata,
	}
	if r.N != nil && *r.N != 1 {
		return p, badRequest("n", "n must be 1: this server returns one choice per prompt, got %d", *r.N)
	}
	p.sampling.Temperature = defaultTemperature
	if t := r.Temperature; t != nil {
		if math.IsNaN(*t) || math.IsInf(*t, 0) || *t < 0 {
			return p, badRequest("temperature", "temperature must be non-negative, got %v", *t)
		}
		p.sampling.Temperature = *t
	}
	if r.Seed != nil {
		p.sampling.Seed = uint64(*r.Seed)
	} else {
		p.sampling.Seed = randomSeed()
	}
	for _, s := range r.Stop {
		if s == "" {
			return p, badRequest("stop", "stop strings must not be empty")
		}
	}
	p.stop = r.Stop
	p.stopTokens = append(p.stopTokens, eos...)
	for _, id := range r.StopTokenIDs {
		if id < 0 || id >= int64(vocab) {
			return p, badRequest("stop_token_ids", "stop token id %d is out of vocabulary (size %d)", id, vocab)
		}
		p.stopTokens = append(p.stopTokens, uint32(id))
	}
	if r.StreamOptions != nil {
		if !r.Stream {
			return p, badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
		p.includeUsage = r.StreamOptions.IncludeUsage == nil || *r.StreamOptions.IncludeUsage
		p.continuousUsage = p.includeUsage && r.StreamOptions.ContinuousUsageStats != nil && *r.StreamOptions.ContinuousUsageStats
	}
	return p, nil
}

// checkMax validates a max_tokens value.
func checkMax(param string, v *int) *apiError {
	if v != nil && *v < 1 {
		return badRequest(param, "%s must be at least 1, got %d", param, *v)
	}
	return nil
}

// isNull reports whether a raw field is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// prompt is one prompt of a completions request: text or token ids.
type prompt struct {
	text   string
	ids    []uint32
	isText bool
}

// parsePrompts reads the prompt field: a string, a list of token ids, or a
// list of strings and token-id lists. Token ids must be in the vocabulary.
func parsePrompts(raw json.RawMessage, vocab, maxPrompts int) ([]prompt, *apiError) {
	missing := badRequest("prompt", "Either prompt or prompt_embeds must be provided and non-empty.")
	if isNull(raw) {
		return nil, missing
	}
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		if s == "" {
			return nil, missing
		}
		return []prompt{{text: s, isText: true}}, nil
	case '[':
	default:
		return nil, badRequest("prompt", "prompt must be a string, a list of token ids, or a list of strings or token-id lists")
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, badRequest("prompt", "prompt: %v", err)
	}
	if len(elems) == 0 {
		return nil, missing
	}
	if ids, ok, err := parseIDs(elems, vocab); ok {
		if err != nil {
			return nil, err
		}
		return []prompt{{ids: ids}}, nil
	}
	if len(elems) > maxPrompts {
		return nil, badRequest("prompt", "prompt list length %d exceeds the maximum allowed count of %d", len(elems), maxPrompts)
	}
	out := make([]prompt, 0, len(elems))
	for i, e := range elems {
		e = bytes.TrimSpace(e)
		switch {
		case len(e) > 0 && e[0] == '"':
			var s string
			if err := json.Unmarshal(e, &s); err != nil {
				return nil, badRequest("prompt", "prompt[%d]: %v", i, err)
			}
			if s == "" {
				return nil, badRequest("prompt", "prompt[%d] is empty", i)
			}
			out = append(out, prompt{text: s, isText: true})
		case len(e) > 0 && e[0] == '[':
			var sub []json.RawMessage
			if err := json.Unmarshal(e, &sub); err != nil {
				return nil, badRequest("prompt", "prompt[%d]: %v", i, err)
			}
			ids, ok, err := parseIDs(sub, vocab)
			if err != nil {
				return nil, err
			}
			if !ok || len(ids) == 0 {
				return nil, badRequest("prompt", "prompt[%d] must be a non-empty list of token ids", i)
			}
			out = append(out, prompt{ids: ids})
		default:
			return nil, badRequest("prompt", "prompt[%d] must be a string or a list of token ids", i)
		}
	}
	return out, nil
}

// parseIDs reads elems as token ids. ok is false when the first element is
// not a number (the list is not a token-id list); err reports a bad id.
func parseIDs(elems []json.RawMessage, vocab int) (ids []uint32, ok bool, err *apiError) {
	if len(elems) == 0 {
		return nil, true, nil
	}
	if first := bytes.TrimSpace(elems[0]); len(first) == 0 || !(first[0] == '-' || (first[0] >= '0' && first[0] <= '9')) {
		return nil, false, nil
	}
	ids = make([]uint32, 0, len(elems))
	for _, e := range elems {
		n, perr := strconv.ParseInt(string(bytes.TrimSpace(e)), 10, 64)
		if perr != nil {
			return nil, true, badRequest("prompt", "prompt token ids must be integers, got %.40s", e)
		}
		if n < 0 || n >= int64(vocab) {
			return nil, true, badRequest("prompt", "Token id %d is out of vocabulary (size %d)", n, vocab)
		}
		ids = append(ids, uint32(n))
	}
	return ids, true, nil
}

// ChatTurn is one chat message as a chat template sees it: its role and
// its text (text parts joined by newlines).
type ChatTurn struct {
	Role    string
	Content string
}

// parseMessages checks a chat request's messages and returns their turns.
func parseMessages(msgs []ChatMessage) ([]ChatTurn, *apiError) {
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty list")
	}
	turns := make([]ChatTurn, 0, len(msgs))
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer", "user", "assistant":
		default:
			return nil, badRequest("messages", "messages[%d].role %q is not supported: use system, developer, user or assistant", i, m.Role)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages", "messages[%d].content: %s", i, err)
		}
		turns = append(turns, ChatTurn{Role: m.Role, Content: text})
	}
	return turns, nil
}

// messageText is a message content's text: a string, null, or text parts.
func messageText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fmt.Errorf("must be a string or a list of text parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", fmt.Errorf("part %d has type %q: only text parts are supported", i, p.Type)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

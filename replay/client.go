package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Error kinds, the keys of Report.Errors. An HTTP status other than 200
// counts as "http_" and the status ("http_503").
const (
	ErrKindConnect      = "connect"       // no response: refused, reset before the headers, bad host
	ErrKindTimeout      = "timeout"       // the request ran past its timeout
	ErrKindStreamBroken = "stream_broken" // the stream ended before [DONE] or was not SSE
	ErrKindStreamError  = "stream_error"  // the server sent an error event mid-stream
)

// Target is an OpenAI-compatible server replayed against: a kvstrata
// worker, a frontend, or vLLM. It is safe for concurrent use.
type Target struct {
	url    string // …/v1/completions
	model  string
	client *http.Client
	clock  Clock
}

// NewTarget returns the target at base (http://host:port, with or without
// a path prefix; /v1/completions is appended). model is the name requests
// carry ("" lets the server choose); client nil means a client without a
// limit on idle connections per host; clock nil means the real one.
func NewTarget(base, model string, client *http.Client, clock Clock) (*Target, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("replay: target %q is not an http:// or https:// URL", base)
	}
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 1024
		client = &http.Client{Transport: tr}
	}
	if clock == nil {
		clock = RealClock{}
	}
	return &Target{url: strings.TrimSuffix(u.String(), "/") + "/v1/completions", model: model, client: client, clock: clock}, nil
}

// Result is what one request measured.
type Result struct {
	Sent time.Time // when the request was sent
	// TTFT is from sending to the first chunk with text.
	TTFT time.Duration
	// ITL holds one inter-token latency per token after the first: a
	// chunk that arrives g after the previous content chunk and carries k
	// tokens adds k latencies of g/k; a first chunk of k tokens adds k-1
	// latencies of 0, its later tokens having come with the first. A chunk
	// carries one token unless it has cumulative usage (vLLM's
	// continuous_usage_stats), which tells how many: a server that holds
	// back a token ending mid-character sends it with the next.
	ITL []time.Duration
	// E2E is from sending to the end of the stream.
	E2E          time.Duration
	PromptTokens int64 // as the server's usage says
	CachedTokens int64 // usage.prompt_tokens_details.cached_tokens
	// OutputTokens is usage.completion_tokens, or the tokens counted in
	// the chunks when the server sends no usage.
	OutputTokens int64
	ErrKind      string // "" on success, else one of the ErrKind… or "http_NNN"
	Err          error
}

// completionRequest is the body sent: a token-id prompt, ignore_eos so
// that exactly max_tokens come back, streamed with usage.
type completionRequest struct {
	Model         string        `json:"model,omitempty"`
	Prompt        []uint32      `json:"prompt"`
	MaxTokens     int64         `json:"max_tokens"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	Temperature   float64       `json:"temperature"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
}

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

// chunk is what replay reads of a streamed completion chunk.
type chunk struct {
	Choices []struct {
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		CompletionTokens    int64 `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Send sends one streamed completion of prompt and measures it. timeout
// bounds the whole request (0: none). Failures are in the Result, never
// a panic or a hang past timeout.
func (t *Target) Send(ctx context.Context, prompt []uint32, maxTokens int64, timeout time.Duration) Result {
	body, err := json.Marshal(completionRequest{Model: t.model, Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true,
		Stream: true, StreamOptions: streamOptions{IncludeUsage: true, ContinuousUsageStats: true}})
	if err != nil {
		return Result{ErrKind: ErrKindConnect, Err: err}
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return Result{ErrKind: ErrKindConnect, Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	r := Result{Sent: t.clock.Now()}
	resp, err := t.client.Do(req)
	if err != nil {
		return r.fail(ctx, ErrKindConnect, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return r.fail(ctx, fmt.Sprintf("http_%d", resp.StatusCode),
			fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg)))
	}
	return t.read(ctx, resp.Body, r)
}

// read reads the SSE stream. It reads the clock once per event, when the
// event has arrived whole.
func (t *Target) read(ctx context.Context, body io.Reader, r Result) Result {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var last time.Time // the previous content chunk
	var counted, cumulative int64
	usage := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, other fields
		}
		data = bytes.TrimSpace(data)
		now := t.clock.Now()
		if string(data) == "[DONE]" {
			r.E2E = now.Sub(r.Sent)
			if !usage {
				r.OutputTokens = counted
			}
			return r
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return r.fail(ctx, ErrKindStreamBroken, fmt.Errorf("a stream event is not JSON: %v", err))
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return r.fail(ctx, ErrKindStreamError, fmt.Errorf("the server reported: %s", c.Error))
		}
		tokens := int64(0)
		text := len(c.Choices) > 0 && c.Choices[0].Text != ""
		if c.Usage != nil {
			usage = true
			r.PromptTokens, r.OutputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				r.CachedTokens = d.CachedTokens
			}
			if len(c.Choices) > 0 {
				tokens = c.Usage.CompletionTokens - cumulative
				cumulative = c.Usage.CompletionTokens
			}
		} else if text {
			tokens = 1
		}
		if !text && tokens == 0 {
			continue
		}
		tokens = max(tokens, 1)
		counted += tokens
		if last.IsZero() {
			r.TTFT = now.Sub(r.Sent)
			for range tokens - 1 {
				r.ITL = append(r.ITL, 0)
			}
		} else {
			gap := now.Sub(last) / time.Duration(tokens)
			for range tokens {
				r.ITL = append(r.ITL, gap)
			}
		}
		last = now
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return r.fail(ctx, ErrKindStreamBroken, fmt.Errorf("the stream ended before [DONE]: %w", err))
}

// fail marks r failed with kind, or as a timeout if ctx's deadline passed.
func (r Result) fail(ctx context.Context, kind string, err error) Result {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		kind = ErrKindTimeout
	}
	r.ErrKind, r.Err = kind, err
	return r
}

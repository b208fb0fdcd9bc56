package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// byteTok is a tokenizer whose ids are bytes: id b < 256 is byte b; id
// 256 is the end-of-sequence token, which decodes to nothing.
type byteTok struct{}

const eosID = 256

var testTok byteTok

func (byteTok) Encode(text string) []uint32 {
	ids := make([]uint32, len(text))
	for i := range len(text) {
		ids[i] = uint32(text[i])
	}
	return ids
}

func (byteTok) Decode(ids []uint32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}

func (byteTok) VocabSize() int { return 257 }

// testEngine is a deterministic engine: it generates gen(r, i) for the
// i-th token (by default the prompt, repeated), perOutput tokens per
// Output, honours MaxTokens, StopTokens, IgnoreEOS and ctx, and reports
// cached tokens as half the prompt.
type testEngine struct {
	gen       func(r sched.Request, i int) uint32
	perOutput int
	delay     time.Duration // before each Output
	startErr  error         // Generate's error
	failAt    int           // >0: fail with failErr after this many tokens
	failErr   error
	// contextLen, if set, is checked as the real engine checks it.
	contextLen int
	transfer   *sched.KVTransferParams // the last Output's Transfer
	aborted    chan string             // gets the ID of each request cancelled before its end
	mu         sync.Mutex
	reqs       []sched.Request
	ctxs       []context.Context
}

func (e *testEngine) Generate(ctx context.Context, r sched.Request) (<-chan sched.Output, error) {
	e.mu.Lock()
	e.reqs = append(e.reqs, r)
	e.ctxs = append(e.ctxs, ctx)
	e.mu.Unlock()
	if e.startErr != nil {
		return nil, e.startErr
	}
	if len(r.Prompt) == 0 || r.MaxTokens < 1 || (e.contextLen > 0 && r.MaxTokens > e.contextLen-len(r.Prompt)) {
		// Not a sched error: the server answers 500, which tests refuse.
		return nil, fmt.Errorf("test engine: the server broke sched.Request's rules: %d prompt tokens, max %d, context %d",
			len(r.Prompt), r.MaxTokens, e.contextLen)
	}
	ch := make(chan sched.Output, 1)
	go e.run(ctx, r, ch)
	return ch, nil
}

func (e *testEngine) requests() []sched.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]sched.Request(nil), e.reqs...)
}

func (e *testEngine) run(ctx context.Context, r sched.Request, ch chan<- sched.Output) {
	defer close(ch)
	gen := e.gen
	if gen == nil {
		gen = func(r sched.Request, i int) uint32 { return r.Prompt[i%len(r.Prompt)] }
	}
	per := max(e.perOutput, 1)
	usage := sched.Usage{PromptTokens: len(r.Prompt), CachedTokens: len(r.Prompt) / 2}
	final := func(o sched.Output) {
		usage.CompletionTokens += len(o.Tokens)
		o.Usage = usage
		select {
		case ch <- o:
		case <-time.After(5 * time.Second): // the reader is gone
		}
	}
	var pending []uint32
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			if e.aborted != nil {
				e.aborted <- r.ID
			}
			final(sched.Output{Tokens: pending, Finish: sched.FinishAbort, Err: ctx.Err()})
			return
		}
		if e.failAt > 0 && i == e.failAt {
			final(sched.Output{Tokens: pending, Finish: sched.FinishAbort, Err: e.failErr})
			return
		}
		t := gen(r, i)
		pending = append(pending, t)
		if !r.IgnoreEOS && containsID(r.StopTokens, t) {
			final(sched.Output{Tokens: pending, Finish: sched.FinishStop, Transfer: e.transfer})
			return
		}
		if i+1 == r.MaxTokens {
			final(sched.Output{Tokens: pending, Finish: sched.FinishLength, Transfer: e.transfer})
			return
		}
		if len(pending) < per {
			continue
		}
		if e.delay > 0 {
			time.Sleep(e.delay)
		}
		select {
		case ch <- sched.Output{Tokens: pending}:
			usage.CompletionTokens += len(pending)
			pending = nil
		case <-ctx.Done():
		}
	}
}

func containsID(ids []uint32, id uint32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// script generates the bytes of s, then EOS.
func script(s string) func(sched.Request, int) uint32 {
	return func(_ sched.Request, i int) uint32 {
		if i < len(s) {
			return uint32(s[i])
		}
		return eosID
	}
}

const testModel = "kvstrata-test"

// newTestServer serves an engine over httptest; cfg may adjust the config.
func newTestServer(t *testing.T, e *testEngine, adjust func(*Config)) *httptest.Server {
	t.Helper()
	cfg := Config{Engine: e, Tokenizer: byteTok{}, ModelName: testModel, ContextLen: 64, StopTokens: []uint32{eosID},
		Logger: slog.New(slog.DiscardHandler)}
	if adjust != nil {
		adjust(&cfg)
	}
	e.contextLen = cfg.ContextLen
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// post sends body to path and returns the status and the whole answer.
func post(t *testing.T, ts *httptest.Server, path, body string) (int, http.Header, string) {
	t.Helper()
	resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// errorOf decodes an error answer, failing unless it has vLLM's shape.
func errorOf(t *testing.T, body string) errorInfo {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	inner, ok := raw["error"]
	if !ok || len(raw) != 1 {
		t.Fatalf("error body %q: want only an \"error\" object", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := inner[k]; !ok {
			t.Fatalf("error body %q lacks %q", body, k)
		}
	}
	var b errorBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatal(err)
	}
	return b.Error
}

// events splits an SSE body into its data payloads, failing on any other
// framing than "data: ...\n\n".
func events(t *testing.T, body string) []string {
	t.Helper()
	if !strings.HasSuffix(body, "\n\n") {
		t.Fatalf("stream %q does not end with a blank line", body)
	}
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %q is not one data line", ev)
		}
		out = append(out, data)
	}
	return out
}

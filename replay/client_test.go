package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// step is one event of a scripted stream: after virtual time advances by
// after, the server sends data.
type step struct {
	after time.Duration
	data  string
}

// scriptedServer streams steps as SSE. Before each event it moves the
// clock on, and after it waits until the client has read the clock for it
// (Target reads it once when it sends and once per event it receives), so
// every event is stamped at exactly its scripted instant.
func scriptedServer(t *testing.T, clock *fakeClock, steps []step, check func(completionRequest)) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req completionRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		if check != nil {
			check(req)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		base := clock.readCount()
		for k, s := range steps {
			clock.advance(s.after)
			fmt.Fprintf(w, "data: %s\n\n", s.data)
			w.(http.Flusher).Flush()
			clock.waitReads(base + k + 1)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestTargetMeasuresLatenciesCountingEveryTokenOfAChunk(t *testing.T) {
	clock := newFakeClock()
	// vLLM with continuous_usage_stats: each chunk's usage is cumulative,
	// so the third chunk carries 3 tokens.
	steps := []step{
		{100 * time.Millisecond, `{"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":7,"completion_tokens":1}}`},
		{20 * time.Millisecond, `{"choices":[{"index":0,"text":"b"}],"usage":{"prompt_tokens":7,"completion_tokens":2}}`},
		{30 * time.Millisecond, `{"choices":[{"index":0,"text":"cde"}],"usage":{"prompt_tokens":7,"completion_tokens":5}}`},
		{5 * time.Millisecond, `{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}`},
		{1 * time.Millisecond, `[DONE]`},
	}
	srv := scriptedServer(t, clock, steps, func(req completionRequest) {
		if !slices.Equal(req.Prompt, []uint32{5, 6, 7}) || req.MaxTokens != 5 || !req.IgnoreEOS || !req.Stream ||
			!req.StreamOptions.IncludeUsage || req.Model != "m" {
			t.Errorf("request %+v: want the token-id prompt, max_tokens 5, ignore_eos, streamed with usage, model m", req)
		}
	})
	target, err := NewTarget(srv.URL, "m", nil, clock)
	if err != nil {
		t.Fatal(err)
	}
	r := target.Send(context.Background(), []uint32{5, 6, 7}, 5, 0)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	ms := time.Millisecond
	if r.TTFT != 100*ms || r.E2E != 156*ms {
		t.Errorf("TTFT %v, E2E %v; want 100ms and 156ms", r.TTFT, r.E2E)
	}
	if want := []time.Duration{20 * ms, 10 * ms, 10 * ms, 10 * ms}; !slices.Equal(r.ITL, want) {
		t.Errorf("ITL %v, want %v (the 3-token chunk 30ms after the last counts 3 × 10ms)", r.ITL, want)
	}
	if r.PromptTokens != 7 || r.CachedTokens != 3 || r.OutputTokens != 5 {
		t.Errorf("tokens: prompt %d, cached %d, output %d; want 7, 3, 5", r.PromptTokens, r.CachedTokens, r.OutputTokens)
	}
}

// A first token that ends mid-character comes with the second: the first
// chunk carries both, and the second is timed as arriving with the first.
func TestTargetTimesEveryTokenOfAFirstChunkOfSeveral(t *testing.T) {
	clock := newFakeClock()
	steps := []step{
		{50 * time.Millisecond, `{"choices":[{"index":0,"text":"é"}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`},
		{12 * time.Millisecond, `{"choices":[{"index":0,"text":"f"}],"usage":{"prompt_tokens":4,"completion_tokens":3}}`},
		{0, `[DONE]`},
	}
	target, _ := NewTarget(scriptedServer(t, clock, steps, nil).URL, "", nil, clock)
	r := target.Send(context.Background(), []uint32{1}, 3, 0)
	ms := time.Millisecond
	if r.Err != nil || r.TTFT != 50*ms || r.OutputTokens != 3 || !slices.Equal(r.ITL, []time.Duration{0, 12 * ms}) {
		t.Errorf("err %v, TTFT %v, output %d, ITL %v; want 50ms, 3 tokens, [0s 12ms]", r.Err, r.TTFT, r.OutputTokens, r.ITL)
	}
}

// kvstrata's workers (like vLLM without continuous_usage_stats) send usage
// only at the end: each content chunk counts one token.
func TestTargetMeasuresAStreamWithUsageOnlyAtTheEnd(t *testing.T) {
	clock := newFakeClock()
	steps := []step{
		{40 * time.Millisecond, `{"choices":[{"index":0,"text":"x","finish_reason":null}]}`},
		{0, `{"choices":[{"index":0,"text":"","finish_reason":null}]}`}, // no text: no token
		{8 * time.Millisecond, `{"choices":[{"index":0,"text":"y","finish_reason":null}]}`},
		{6 * time.Millisecond, `{"choices":[{"index":0,"text":"z","finish_reason":"length"}]}`},
		{0, `{"choices":[],"usage":{"prompt_tokens":1024,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":512}}}`},
		{0, `[DONE]`},
	}
	target, _ := NewTarget(scriptedServer(t, clock, steps, nil).URL, "", nil, clock)
	r := target.Send(context.Background(), []uint32{1}, 3, 0)
	ms := time.Millisecond
	if r.Err != nil || r.TTFT != 40*ms || r.E2E != 54*ms || !slices.Equal(r.ITL, []time.Duration{8 * ms, 6 * ms}) {
		t.Errorf("err %v, TTFT %v, E2E %v, ITL %v; want 40ms, 54ms, [8ms 6ms]", r.Err, r.TTFT, r.E2E, r.ITL)
	}
	if r.OutputTokens != 3 || r.CachedTokens != 512 || r.PromptTokens != 1024 {
		t.Errorf("usage %+v", r)
	}
}

func TestTargetNamesEachKindOfFailure(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n") // then the handler returns: no [DONE]
	}))
	defer cut.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\ndata: [DONE]\n\n")
	}))
	defer failing.Close()
	hung := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(http.Flusher).Flush()
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hung)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + l.Addr().String()
	l.Close()

	for _, c := range []struct {
		url, kind string
		timeout   time.Duration
	}{
		{busy.URL, "http_503", 0},
		{cut.URL, ErrKindStreamBroken, 0},
		{failing.URL, ErrKindStreamError, 0},
		{slow.URL, ErrKindTimeout, 100 * time.Millisecond},
		{refused, ErrKindConnect, 0},
	} {
		target, _ := NewTarget(c.url, "", nil, nil)
		r := target.Send(context.Background(), []uint32{1}, 1, c.timeout)
		if r.ErrKind != c.kind || r.Err == nil {
			t.Errorf("%s: kind %q (%v), want %q", c.url, r.ErrKind, r.Err, c.kind)
		}
	}
	if r := (func() Result {
		t, _ := NewTarget(busy.URL, "", nil, nil)
		return t.Send(context.Background(), nil, 1, 0)
	})(); !strings.Contains(r.Err.Error(), "overloaded") {
		t.Errorf("an HTTP error does not carry the server's message: %v", r.Err)
	}
}

func TestNewTargetRefusesAURLThatIsNotHTTP(t *testing.T) {
	for _, u := range []string{"", "localhost:8000", "ftp://x", "http://", "://bad"} {
		if _, err := NewTarget(u, "", nil, nil); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
}

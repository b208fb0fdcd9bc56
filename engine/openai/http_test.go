package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// Raw HTTP: the exact bytes on the wire.

func TestSSEFraming(t *testing.T) {
	e := &testEngine{gen: script("ok")}
	ts := newTestServer(t, e, nil)
	status, h, body := post(t, ts, "/v1/completions", `{"model":"kvstrata-test","prompt":"x","stream":true,"stream_options":{"include_usage":true}}`)
	if status != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d content type %q", status, h.Get("Content-Type"))
	}
	evs := events(t, body)
	if evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", evs[len(evs)-1])
	}
	var text string
	for i, ev := range evs[:len(evs)-1] {
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Index        int     `json:"index"`
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usageJSON `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %d %q: %v", i, ev, err)
		}
		if c.Object != "text_completion" {
			t.Errorf("event %d object %q", i, c.Object)
		}
		last := i == len(evs)-2
		if last != (c.Usage != nil) || last != (len(c.Choices) == 0) {
			t.Errorf("event %d %q: only the last event carries usage, and no choices", i, ev)
		}
		for _, ch := range c.Choices {
			text += ch.Text
			if ch.FinishReason != nil && (*ch.FinishReason != "stop" || i != len(evs)-3) {
				t.Errorf("event %d finish reason %q: want stop, on the last choice chunk", i, *ch.FinishReason)
			}
		}
	}
	if text != "ok" {
		t.Errorf("streamed %q, want \"ok\"", text)
	}
}

func TestChatStreamFraming(t *testing.T) {
	e := &testEngine{gen: script("yo")}
	ts := newTestServer(t, e, func(c *Config) { c.ContextLen = 200 })
	_, _, body := post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stream":true}`)
	evs := events(t, body)
	if evs[len(evs)-1] != "[DONE]" || len(evs) < 3 {
		t.Fatalf("events %q", evs)
	}
	if !strings.Contains(evs[0], `"delta":{"role":"assistant","content":""}`) || !strings.Contains(evs[0], `"finish_reason":null`) {
		t.Errorf("first event %s, want the role delta", evs[0])
	}
	if !strings.Contains(evs[len(evs)-2], `"finish_reason":"stop"`) {
		t.Errorf("last chunk %s, want finish_reason stop", evs[len(evs)-2])
	}
	for _, ev := range evs[:len(evs)-1] {
		if strings.Contains(ev, `"usage"`) {
			t.Errorf("chunk %s has usage without include_usage", ev)
		}
	}
	if got := testTok.Decode(e.requests()[0].Prompt); !strings.Contains(got, "user\na\nb<|im_end|>") {
		t.Errorf("prompt %q: text parts are joined by newlines", got)
	}
}

func TestErrorAnswers(t *testing.T) {
	long := strings.Repeat("y", 60)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		typ, param, message      string
	}{
		{"bad json", "POST", "/v1/completions", `{"prompt": "x"`, 400, "BadRequestError", "", "invalid JSON body"},
		{"empty body", "POST", "/v1/completions", ``, 400, "BadRequestError", "", "empty"},
		{"wrong type", "POST", "/v1/completions", `{"prompt":"x","max_tokens":"many"}`, 400, "BadRequestError", "max_tokens", "max_tokens"},
		{"no prompt", "POST", "/v1/completions", `{"model":"kvstrata-test"}`, 400, "BadRequestError", "prompt", "Either prompt or prompt_embeds must be provided and non-empty."},
		{"empty prompt list", "POST", "/v1/completions", `{"prompt":[]}`, 400, "BadRequestError", "prompt", "must be provided"},
		{"token out of vocabulary", "POST", "/v1/completions", `{"prompt":[1,2,257]}`, 400, "BadRequestError", "prompt", "Token id 257 is out of vocabulary"},
		{"negative token", "POST", "/v1/completions", `{"prompt":[[1],[-1]]}`, 400, "BadRequestError", "prompt", "Token id -1 is out of vocabulary"},
		{"n=2", "POST", "/v1/completions", `{"prompt":"x","n":2}`, 400, "BadRequestError", "n", "n must be 1"},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "BadRequestError", "max_tokens", "at least 1"},
		{"negative temperature", "POST", "/v1/completions", `{"prompt":"x","temperature":-1}`, 400, "BadRequestError", "temperature", "non-negative"},
		{"stream options without stream", "POST", "/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream_options", "Stream options can only be defined when `stream=True`."},
		{"logprobs", "POST", "/v1/completions", `{"prompt":"x","logprobs":2}`, 400, "BadRequestError", "logprobs", "not supported"},
		{"max tokens over context", "POST", "/v1/completions", `{"prompt":"` + long + `","max_tokens":10}`, 400, "BadRequestError", "max_tokens",
			"'max_tokens' or 'max_completion_tokens' is too large: 10. This model's maximum context length is 64 tokens and your request has 60 input tokens (10 > 64 - 60)."},
		{"max tokens near MaxInt", "POST", "/v1/completions", `{"prompt":"x","max_tokens":9223372036854775807}`, 400, "BadRequestError", "max_tokens", "too large: 9223372036854775807"},
		{"default max tokens over context", "POST", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "BadRequestError", "max_tokens", "too large: 16"},
		{"unknown model", "POST", "/v1/completions", `{"model":"other","prompt":"x"}`, 404, "NotFoundError", "model", "The model `other` does not exist."},
		{"chat unknown model", "POST", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "model", "The model `other` does not exist."},
		{"chat no messages", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "BadRequestError", "messages", "non-empty"},
		{"chat bad role", "POST", "/v1/chat/completions", `{"messages":[{"role":"tool","content":"x"}]}`, 400, "BadRequestError", "messages", "role \"tool\""},
		{"chat image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "BadRequestError", "messages", "only text parts"},
		{"chat tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, 400, "BadRequestError", "tools", "not supported"},
		{"chat too long", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "BadRequestError", "input_tokens", "This model's maximum context length is 64 tokens. However, your request has"},
		{"unknown path", "POST", "/v1/embeddings", `{}`, 404, "Not Found", "", "Not Found"},
		{"get completions", "GET", "/v1/completions", ``, 405, "Method Not Allowed", "", "Method Not Allowed"},
		{"post models", "POST", "/v1/models", `{}`, 405, "Method Not Allowed", "", "Method Not Allowed"},
		{"too large", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("z", 300) + `"}`, 413, "Request Entity Too Large", "", "exceeds 256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &testEngine{}
			ts := newTestServer(t, e, func(c *Config) { c.MaxBodyBytes = 256 })
			req, _ := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader(tc.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			got := errorOf(t, string(b))
			if got.Code != tc.status || got.Type != tc.typ || !strings.Contains(got.Message, tc.message) {
				t.Errorf("error %+v, want code %d type %q message containing %q", got, tc.status, tc.typ, tc.message)
			}
			if (got.Param == nil) != (tc.param == "") || (got.Param != nil && *got.Param != tc.param) {
				t.Errorf("param %v, want %q", got.Param, tc.param)
			}
			if tc.status == 405 && resp.Header.Get("Allow") == "" {
				t.Errorf("405 without an Allow header")
			}
			if n := len(e.requests()); n != 0 {
				t.Errorf("bad input reached the engine (%d requests)", n)
			}
		})
	}
}

func TestErrorBodyExact(t *testing.T) {
	ts := newTestServer(t, &testEngine{}, nil)
	_, _, body := post(t, ts, "/v1/completions", `{"model":"nope","prompt":"x"}`)
	want := `{"error":{"message":"The model ` + "`nope`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}` + "\n"
	if body != want {
		t.Fatalf("body %s\nwant %s", body, want)
	}
}

func TestBatchPrompts(t *testing.T) {
	e := &testEngine{}
	ts := newTestServer(t, e, nil)
	for _, tc := range []struct{ prompt, want0, want1 string }{
		{`["ab","cde"]`, "abab", "cdec"},
		{`[[97,98],[99,100,101]]`, "abab", "cdec"},
		{`["ab",[99,100,101]]`, "abab", "cdec"},
	} {
		status, _, body := post(t, ts, "/v1/completions", `{"prompt":`+tc.prompt+`,"max_tokens":4}`)
		if status != 200 {
			t.Fatalf("prompt %s: %d %s", tc.prompt, status, body)
		}
		var res completionView
		if err := json.Unmarshal([]byte(body), &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Choices) != 2 || res.Choices[0].Index != 0 || res.Choices[1].Index != 1 ||
			res.Choices[0].Text != tc.want0 || res.Choices[1].Text != tc.want1 {
			t.Fatalf("prompt %s: choices %+v", tc.prompt, res.Choices)
		}
		if u := res.Usage; u.PromptTokens != 5 || u.CompletionTokens != 8 || u.TotalTokens != 13 || u.PromptTokensDetails.CachedTokens != 2 {
			t.Errorf("prompt %s: usage %+v", tc.prompt, u)
		}
	}
	// Streamed, each chunk names its prompt's index.
	_, _, body := post(t, ts, "/v1/completions", `{"prompt":["ab","cde"],"max_tokens":4,"stream":true}`)
	texts := map[int]string{}
	for _, ev := range events(t, body) {
		if ev == "[DONE]" {
			continue
		}
		var c completionView
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			texts[ch.Index] += ch.Text
		}
	}
	if texts[0] != "abab" || texts[1] != "cdec" {
		t.Errorf("streamed batch %v", texts)
	}
}

// completionView reads a completion answer.
type completionView struct {
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		StopReason   any     `json:"stop_reason"`
	} `json:"choices"`
	Usage            usageJSON               `json:"usage"`
	KVTransferParams *sched.KVTransferParams `json:"kv_transfer_params"`
}

func TestEcho(t *testing.T) {
	ts := newTestServer(t, &testEngine{gen: script("!")}, nil)
	for _, body := range []string{`{"prompt":"hey","echo":true}`, `{"prompt":[104,101,121],"echo":true}`} {
		_, _, b := post(t, ts, "/v1/completions", body)
		var res completionView
		json.Unmarshal([]byte(b), &res)
		if len(res.Choices) != 1 || res.Choices[0].Text != "hey!" {
			t.Errorf("%s: %s", body, b)
		}
	}
}

func TestStopStrings(t *testing.T) {
	e := &testEngine{gen: script("hello world, again"), aborted: make(chan string, 4)}
	ts := newTestServer(t, e, nil)
	_, _, b := post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":30,"stop":["xyz","wor"]}`)
	var res completionView
	if err := json.Unmarshal([]byte(b), &res); err != nil {
		t.Fatal(err)
	}
	c := res.Choices[0]
	if c.Text != "hello " || c.FinishReason == nil || *c.FinishReason != "stop" || c.StopReason != "wor" {
		t.Fatalf("choice %+v, want \"hello \" stopped by \"wor\"", c)
	}
	select {
	case <-e.aborted:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine request was not cancelled within 5 s of the stop string")
	}
	if res.Usage.CompletionTokens != 9 {
		t.Errorf("completion tokens %d, want 9 (through the token that completed the stop string)", res.Usage.CompletionTokens)
	}

	// Streamed: no chunk ever shows a part of the stop string (chunks only
	// add text, so a leaked "l" would stay in the whole).
	_, _, b = post(t, ts, "/v1/completions", `{"prompt":"x","max_tokens":30,"stop":"ld, ag","stream":true}`)
	var text string
	for _, ev := range events(t, b) {
		if ev == "[DONE]" {
			continue
		}
		var c completionView
		json.Unmarshal([]byte(ev), &c)
		for _, ch := range c.Choices {
			text += ch.Text
		}
	}
	if text != "hello wor" {
		t.Errorf("streamed %q, want \"hello wor\"", text)
	}
}

func TestStopTokenIDs(t *testing.T) {
	e := &testEngine{gen: script("abcdef")}
	ts := newTestServer(t, e, nil)
	_, _, b := post(t, ts, "/v1/completions", `{"prompt":"x","stop_token_ids":[100]}`)
	var res completionView
	json.Unmarshal([]byte(b), &res)
	if c := res.Choices[0]; c.Text != "abc" || c.StopReason != float64(100) {
		t.Fatalf("choice %+v, want \"abc\" stopped by token 100", c)
	}
	if got := e.requests()[0].StopTokens; len(got) != 2 || got[0] != eosID || got[1] != 100 {
		t.Errorf("engine stop tokens %v, want EOS and 100", got)
	}
	// ignore_eos generates max_tokens whatever they are.
	_, _, b = post(t, ts, "/v1/completions", `{"prompt":"x","ignore_eos":true,"max_tokens":8}`)
	json.Unmarshal([]byte(b), &res)
	if c := res.Choices[0]; c.Text != "abcdef" || *c.FinishReason != "length" || res.Usage.CompletionTokens != 8 {
		t.Fatalf("ignore_eos: %s", b)
	}
}

func TestUTF8HeldBack(t *testing.T) {
	const want = "aé€😀z"
	e := &testEngine{gen: script(want)}
	ts := newTestServer(t, e, nil)
	_, _, b := post(t, ts, "/v1/completions", `{"prompt":"x","stream":true}`)
	var text string
	chunks := 0
	for _, ev := range events(t, b) {
		if ev == "[DONE]" {
			continue
		}
		if strings.Contains(ev, `\ufffd`) || strings.ContainsRune(ev, utf8.RuneError) {
			t.Errorf("chunk %s has a replacement character: a character was split", ev)
		}
		var c completionView
		json.Unmarshal([]byte(ev), &c)
		for _, ch := range c.Choices {
			text += ch.Text
			chunks++
		}
	}
	if text != want || chunks < 5 {
		t.Fatalf("streamed %q in %d chunks, want %q in one chunk per character", text, chunks, want)
	}
}

// A client that leaves cancels its engine request, and its leaving is no
// failure of the server's: nothing is logged above debug level.
func TestClientDisconnectCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			e := &testEngine{delay: time.Millisecond, aborted: make(chan string, 1)}
			var log levelLog
			ts := newTestServer(t, e, func(c *Config) { c.ContextLen = 1 << 20; c.Logger = slog.New(&log) })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"prompt":"abc","max_tokens":1000000,"stream":%v}`, stream)))
			if stream {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				line, err := bufio.NewReader(resp.Body).ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "data: {") {
					t.Fatalf("first line %q: %v", line, err)
				}
				cancel()
				resp.Body.Close()
			} else {
				// The client gives up while the server is still generating.
				go func() {
					for len(e.requests()) == 0 {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
				if _, err := http.DefaultClient.Do(req); !errors.Is(err, context.Canceled) {
					t.Fatalf("request error %v, want the client's cancellation", err)
				}
			}
			select {
			case <-e.aborted:
			case <-time.After(10 * time.Second):
				t.Fatal("the engine request was not cancelled within 10 s of the client leaving")
			}
			ts.Close() // waits for the handler
			if got := log.above(slog.LevelDebug); len(got) > 0 {
				t.Errorf("the client's leaving was logged as %v", got)
			}
		})
	}
}

// levelLog is a slog.Handler that keeps every record.
type levelLog struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *levelLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *levelLog) WithGroup(string) slog.Handler            { return l }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}

// above returns the level and message of each record logged above level.
func (l *levelLog) above(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level > level {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

func TestKVTransferParams(t *testing.T) {
	out := &sched.KVTransferParams{DoRemotePrefill: true, Namespace: "00ff", BlockHashes: []string{"01", "02"}, CacheNode: "127.0.0.1:7000"}
	e := &testEngine{transfer: out}
	ts := newTestServer(t, e, nil)
	_, _, b := post(t, ts, "/v1/completions", `{"prompt":"abc","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"kvstrata_cache_node":"n1"}}`)
	if in := e.requests()[0].Transfer; in == nil || !in.DoRemoteDecode || in.CacheNode != "n1" {
		t.Fatalf("engine got transfer %+v", in)
	}
	var res completionView
	json.Unmarshal([]byte(b), &res)
	if got := res.KVTransferParams; got == nil || !got.DoRemotePrefill || got.Namespace != "00ff" || len(got.BlockHashes) != 2 || got.CacheNode != out.CacheNode {
		t.Fatalf("response kv_transfer_params %+v in %s", got, b)
	}
	if !strings.Contains(b, `"kv_transfer_params":{"do_remote_prefill":true,`) {
		t.Errorf("kv_transfer_params not at the top level: %s", b)
	}
	_, _, b = post(t, ts, "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	if !strings.Contains(b, `"kv_transfer_params":{"do_remote_prefill":true,`) {
		t.Errorf("chat: kv_transfer_params not at the top level: %s", b)
	}
}

// An engine failure answers with its status; the server's own (5xx) are
// logged as warnings, a request's fault (4xx) at debug level only.
func TestEngineFailures(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{sched.ErrOverloaded, 503},
		{fmt.Errorf("queue: %w", sched.ErrClosed), 503},
		{sched.ErrBadRequest, 400},
		{errors.New("kernel panic"), 500},
	} {
		// Failing mid-request, not streamed: the status says it.
		var log levelLog
		ts := newTestServer(t, &testEngine{failAt: 2, failErr: tc.err}, func(c *Config) { c.Logger = slog.New(&log) })
		status, _, b := post(t, ts, "/v1/completions", `{"prompt":"abc"}`)
		if status != tc.status || errorOf(t, b).Code != tc.status {
			t.Errorf("%v: status %d body %s, want %d", tc.err, status, b, tc.status)
		}
		// Streamed: an error event, then [DONE].
		_, _, b = post(t, ts, "/v1/completions", `{"prompt":"abc","stream":true}`)
		evs := events(t, b)
		if len(evs) < 2 || evs[len(evs)-1] != "[DONE]" || errorOf(t, evs[len(evs)-2]).Code != tc.status {
			t.Errorf("%v: stream %q, want an error event with code %d then [DONE]", tc.err, evs, tc.status)
		}
		ts.Close() // waits for the handlers
		if warned, want := len(log.above(slog.LevelInfo)), 2*btoi(tc.status >= 500); warned != want {
			t.Errorf("%v: %d warnings, want %d: %v", tc.err, warned, want, log.above(slog.LevelDebug))
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestInfoEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "x"}))
	var healthErr error
	created := time.Unix(1700000000, 0)
	ts := newTestServer(t, &testEngine{}, func(c *Config) {
		c.Gatherer = reg
		c.Health = func() error { return healthErr }
		c.Version = "1.2.3"
		c.Created = created
	})
	get := func(path string) (int, string) {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if s, b := get("/health"); s != 200 || b != "" {
		t.Errorf("health %d %q", s, b)
	}
	healthErr = errors.New("cache lost")
	if s, b := get("/health"); s != 503 || !strings.Contains(errorOf(t, b).Message, "cache lost") {
		t.Errorf("unhealthy: %d %q", s, b)
	}
	if s, b := get("/version"); s != 200 || b != "{\"version\":\"1.2.3\"}\n" {
		t.Errorf("version %d %q", s, b)
	}
	s, b := get("/v1/models")
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Object      string `json:"object"`
			Created     int64  `json:"created"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(b), &models); err != nil || s != 200 {
		t.Fatalf("models %d %q: %v", s, b, err)
	}
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != testModel || models.Data[0].Object != "model" ||
		models.Data[0].Created != created.Unix() || models.Data[0].MaxModelLen != 64 {
		t.Errorf("models %+v", models)
	}
	if s, b := get("/metrics"); s != 200 || !strings.Contains(b, "vllm:request_success_total 0") {
		t.Errorf("metrics %d %q", s, b)
	}
	// Without a Gatherer there is no /metrics.
	ts2 := newTestServer(t, &testEngine{}, nil)
	resp, err := http.Get(ts2.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("metrics without a gatherer: %d", resp.StatusCode)
	}
}

func TestConfigValidate(t *testing.T) {
	_, err := New(Config{ContextLen: 1, MaxBodyBytes: -1})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("error %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"engine is nil", "tokenizer is nil", "model name is empty", "context length is 1", "max body bytes is -1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err = New(Config{Engine: &testEngine{}, Tokenizer: testTok, ModelName: "m", ContextLen: 8, StopTokens: []uint32{300}})
	if err == nil || !strings.Contains(err.Error(), "stop token 300") {
		t.Errorf("stop token outside the vocabulary: %v", err)
	}
}

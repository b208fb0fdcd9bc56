package openai

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzRequests posts arbitrary bodies to both generation endpoints: the
// server must never panic and must answer 2xx or 4xx only, a 4xx with a
// vLLM error body. Seeds are in testdata/fuzz/FuzzRequests.
func FuzzRequests(f *testing.F) {
	f.Add(false, []byte(`{"prompt":"hi","max_tokens":3}`))
	f.Add(true, []byte(`{"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	s, err := New(Config{
		Engine: &testEngine{contextLen: 64}, Tokenizer: testTok, ModelName: testModel, ContextLen: 64,
		StopTokens: []uint32{eosID}, MaxBodyBytes: 1 << 16, MaxBatchPrompts: 8,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, chat bool, body []byte) {
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := httptest.NewRecorder()
		served := make(chan struct{})
		go func() {
			defer close(served)
			s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		}()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatalf("no answer within 10 s to %q", body)
		}
		switch code := rec.Code; {
		case code >= 200 && code < 300:
		case code >= 400 && code < 500:
			var b errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.Error.Code != code || b.Error.Message == "" {
				t.Fatalf("status %d with body %q", code, rec.Body.Bytes())
			}
		default:
			t.Fatalf("status %d for %q: %s", code, body, rec.Body.Bytes())
		}
	})
}

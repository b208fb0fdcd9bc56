package openai

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestReturnTokenIDs: return_token_ids adds the prompt's ids and the
// generated ids, stop token included, to each choice, as vLLM does —
// streamed (prompt ids on each choice's first chunk) and not; without it
// neither field appears.
func TestReturnTokenIDs(t *testing.T) {
	e := &testEngine{gen: script("hi"), perOutput: 1}
	ts := newTestServer(t, e, nil)
	prompt := []uint32{'a', 'b', 'c'}
	want := []uint32{'h', 'i', eosID}

	type choice struct {
		Index          int       `json:"index"`
		Text           string    `json:"text"`
		PromptTokenIDs *[]uint32 `json:"prompt_token_ids"`
		TokenIDs       *[]uint32 `json:"token_ids"`
	}
	type resp struct {
		Choices []choice `json:"choices"`
	}

	t.Run("not streamed", func(t *testing.T) {
		code, _, body := post(t, ts, "/v1/completions", `{"prompt": [97, 98, 99], "max_tokens": 8, "return_token_ids": true}`)
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		var r resp
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatal(err)
		}
		c := r.Choices[0]
		if c.Text != "hi" || c.PromptTokenIDs == nil || !slices.Equal(*c.PromptTokenIDs, prompt) || c.TokenIDs == nil || !slices.Equal(*c.TokenIDs, want) {
			t.Fatalf("choice %s, want text \"hi\", prompt_token_ids %v, token_ids %v", body, prompt, want)
		}
	})
	t.Run("streamed", func(t *testing.T) {
		code, _, body := post(t, ts, "/v1/completions", `{"prompt": [97, 98, 99], "max_tokens": 8, "stream": true, "return_token_ids": true}`)
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		var got []uint32
		var text strings.Builder
		prompts := 0
		for i, ev := range events(t, body) {
			if ev == "[DONE]" {
				continue
			}
			var r resp
			if err := json.Unmarshal([]byte(ev), &r); err != nil {
				t.Fatal(err)
			}
			c := r.Choices[0]
			if c.PromptTokenIDs != nil {
				prompts++
				if i != 0 || !slices.Equal(*c.PromptTokenIDs, prompt) {
					t.Fatalf("chunk %d carries prompt_token_ids %v; want %v on the first chunk only", i, *c.PromptTokenIDs, prompt)
				}
			}
			if c.TokenIDs != nil {
				got = append(got, *c.TokenIDs...)
			}
			text.WriteString(c.Text)
		}
		if prompts != 1 || !slices.Equal(got, want) || text.String() != "hi" {
			t.Fatalf("stream %s: %d prompt_token_ids, token_ids %v, text %q; want 1, %v, \"hi\"", body, prompts, got, text.String(), want)
		}
	})
	t.Run("off by default", func(t *testing.T) {
		for _, stream := range []string{"false", "true"} {
			_, _, body := post(t, ts, "/v1/completions", `{"prompt": [97, 98, 99], "max_tokens": 8, "stream": `+stream+`}`)
			if strings.Contains(body, "token_ids") {
				t.Fatalf("stream=%s without return_token_ids: %s", stream, body)
			}
		}
	})
}

package openai

import (
	"encoding/json"
	"slices"
	"testing"
)

// With continuous_usage_stats, every chunk says how many tokens its choice
// has generated so far, so a client can count the tokens of a chunk that
// carries more than one: here "é" is two tokens (bytes) whose text comes
// in one chunk.
func TestContinuousUsageCountsTheTokensEachChunkCarries(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"xy","max_tokens":4,"ignore_eos":true,"stream":true,
			"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"xy"}],"max_tokens":4,"ignore_eos":true,"stream":true,
			"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`},
	} {
		e := &testEngine{gen: script("aéb")}
		ts := newTestServer(t, e, func(c *Config) { c.ContextLen = 200 })
		status, _, body := post(t, ts, c.path, c.body)
		if status != 200 {
			t.Fatalf("%s: status %d: %s", c.path, status, body)
		}
		var generated []int
		var last usageJSON
		for _, ev := range events(t, body) {
			if ev == "[DONE]" {
				break
			}
			var ch struct {
				Choices []struct {
					Text  string `json:"text"`
					Delta *struct {
						Content *string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *usageJSON `json:"usage"`
			}
			if err := json.Unmarshal([]byte(ev), &ch); err != nil {
				t.Fatal(err)
			}
			if ch.Usage == nil {
				t.Fatalf("%s: chunk %s has no usage", c.path, ev)
			}
			last = *ch.Usage
			if len(ch.Choices) == 0 {
				continue // the include_usage chunk
			}
			text := ch.Choices[0].Text
			if d := ch.Choices[0].Delta; d != nil && d.Content != nil {
				text = *d.Content
			}
			if text != "" {
				generated = append(generated, ch.Usage.CompletionTokens)
			}
		}
		if want := []int{1, 3, 4}; !slices.Equal(generated, want) {
			t.Errorf("%s: completion_tokens of the chunks with text %v, want %v", c.path, generated, want)
		}
		if last.CompletionTokens != 4 || last.PromptTokensDetails == nil {
			t.Errorf("%s: last usage %+v, want 4 completion tokens and the cached tokens", c.path, last)
		}
	}
}

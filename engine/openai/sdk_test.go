package openai

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// The official OpenAI Go SDK is the client here: a server it reads
// correctly speaks the API as clients expect it.

func sdkClient(url string) *sdk.Client {
	c := sdk.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	return &c
}

func TestSDKCompletion(t *testing.T) {
	e := &testEngine{}
	ts := newTestServer(t, e, nil)
	c := sdkClient(ts.URL)
	res, err := c.Completions.New(context.Background(), sdk.CompletionNewParams{
		Model:     testModel,
		Prompt:    sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("hello")},
		MaxTokens: sdk.Int(7),
		Seed:      sdk.Int(42),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].Text != "hellohe" || res.Choices[0].FinishReason != "length" {
		t.Fatalf("choices %+v, want one \"hellohe\" ending by length", res.Choices)
	}
	if res.Object != "text_completion" || res.Model != testModel || !strings.HasPrefix(res.ID, "cmpl-") {
		t.Errorf("id %q object %q model %q", res.ID, res.Object, res.Model)
	}
	u := res.Usage
	if u.PromptTokens != 5 || u.CompletionTokens != 7 || u.TotalTokens != 12 || u.PromptTokensDetails.CachedTokens != 2 {
		t.Errorf("usage %+v, want 5 prompt (2 cached) + 7 completion", u)
	}
	r := e.requests()[0]
	if r.MaxTokens != 7 || r.Sampling.Seed != 42 || r.Sampling.Temperature != 1 || testTok.Decode(r.Prompt) != "hello" {
		t.Errorf("engine request %+v", r)
	}
}

func TestSDKCompletionDefaultMaxTokensAndEOS(t *testing.T) {
	e := &testEngine{gen: script("hi there")}
	ts := newTestServer(t, e, nil)
	res, err := sdkClient(ts.URL).Completions.New(context.Background(), sdk.CompletionNewParams{
		Model:  testModel,
		Prompt: sdk.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{'a', 'b'}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Choices[0]; got.Text != "hi there" || got.FinishReason != "stop" {
		t.Fatalf("choice %+v, want \"hi there\" ending with stop (the EOS token's text is not output)", got)
	}
	if res.Usage.CompletionTokens != 9 {
		t.Errorf("completion tokens %d, want 9 (the EOS token counts)", res.Usage.CompletionTokens)
	}
	if got := e.requests()[0].MaxTokens; got != 16 {
		t.Errorf("default max_tokens %d, want 16", got)
	}
}

func TestSDKCompletionStream(t *testing.T) {
	e := &testEngine{perOutput: 2}
	ts := newTestServer(t, e, nil)
	stream := sdkClient(ts.URL).Completions.NewStreaming(context.Background(), sdk.CompletionNewParams{
		Model:         testModel,
		Prompt:        sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("abc")},
		MaxTokens:     sdk.Int(5),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	})
	var text strings.Builder
	var finish string
	var usage *sdk.CompletionUsage
	chunks := 0
	for stream.Next() {
		c := stream.Current()
		chunks++
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
			if ch.FinishReason != "" {
				finish = string(ch.FinishReason)
			}
		}
		if c.Usage.TotalTokens > 0 {
			if len(c.Choices) != 0 {
				t.Errorf("the usage chunk has choices %+v", c.Choices)
			}
			usage = &c.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != "abcab" || finish != "length" || chunks < 3 {
		t.Fatalf("streamed %q in %d chunks ending %q, want \"abcab\" in several, ending by length", text.String(), chunks, finish)
	}
	if usage == nil || usage.PromptTokens != 3 || usage.CompletionTokens != 5 || usage.PromptTokensDetails.CachedTokens != 1 {
		t.Fatalf("usage %+v", usage)
	}
}

func TestSDKChat(t *testing.T) {
	e := &testEngine{gen: script("Hello, human.")}
	ts := newTestServer(t, e, func(c *Config) { c.ContextLen = 256 })
	res, err := sdkClient(ts.URL).Chat.Completions.New(context.Background(), sdk.ChatCompletionNewParams{
		Model: testModel,
		Messages: []sdk.ChatCompletionMessageParamUnion{
			sdk.SystemMessage("Be brief."),
			sdk.UserMessage("Hi"),
		},
		MaxCompletionTokens: sdk.Int(100),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 {
		t.Fatalf("%d choices", len(res.Choices))
	}
	ch := res.Choices[0]
	if ch.Message.Content != "Hello, human." || ch.Message.Role != "assistant" || ch.FinishReason != "stop" {
		t.Fatalf("choice %+v", ch)
	}
	if res.Object != "chat.completion" || !strings.HasPrefix(res.ID, "chatcmpl-") {
		t.Errorf("object %q id %q", res.Object, res.ID)
	}
	wantPrompt := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	r := e.requests()[0]
	if got := testTok.Decode(r.Prompt); got != wantPrompt || r.MaxTokens != 100 {
		t.Errorf("engine prompt %q max %d, want %q and 100", got, r.MaxTokens, wantPrompt)
	}
	if res.Usage.PromptTokens != int64(len(wantPrompt)) || res.Usage.CompletionTokens != 14 {
		t.Errorf("usage %+v", res.Usage)
	}
}

func TestSDKChatStream(t *testing.T) {
	e := &testEngine{gen: script("streamed reply")}
	ts := newTestServer(t, e, func(c *Config) { c.ContextLen = 256 })
	stream := sdkClient(ts.URL).Chat.Completions.NewStreaming(context.Background(), sdk.ChatCompletionNewParams{
		Model:         testModel,
		Messages:      []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("go")},
		MaxTokens:     sdk.Int(50),
		StreamOptions: sdk.ChatCompletionStreamOptionsParam{IncludeUsage: sdk.Bool(true)},
	})
	var acc sdk.ChatCompletionAccumulator
	first := true
	for stream.Next() {
		c := stream.Current()
		acc.AddChunk(c)
		if first {
			if len(c.Choices) != 1 || c.Choices[0].Delta.Role != "assistant" || c.Choices[0].Delta.Content != "" {
				t.Fatalf("first chunk %+v, want the assistant role and no content", c.Choices)
			}
			first = false
		}
		if c.Object != "chat.completion.chunk" {
			t.Errorf("object %q", c.Object)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	got := acc.Choices[0]
	if got.Message.Content != "streamed reply" || got.FinishReason != "stop" {
		t.Fatalf("accumulated %+v", got)
	}
	promptLen := len(ChatML([]ChatTurn{{Role: "user", Content: "go"}}))
	if acc.Usage.CompletionTokens != 15 || acc.Usage.PromptTokens != int64(promptLen) {
		t.Errorf("usage %+v", acc.Usage)
	}
}

func TestSDKErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		startErr error
		model    string
		prompt   string
		status   int
		message  string
	}{
		{"unknown model", nil, "gpt-9", "hi", http.StatusNotFound, "The model `gpt-9` does not exist."},
		{"prompt too long", nil, testModel, strings.Repeat("x", 64), http.StatusBadRequest,
			"This model's maximum context length is 64 tokens. However, your request has 64 input tokens. Please reduce the length of the input messages."},
		{"overloaded", sched.ErrOverloaded, testModel, "hi", http.StatusServiceUnavailable, sched.ErrOverloaded.Error()},
		{"closed", sched.ErrClosed, testModel, "hi", http.StatusServiceUnavailable, sched.ErrClosed.Error()},
		{"engine says too long", sched.ErrTooLong, testModel, "hi", http.StatusBadRequest, sched.ErrTooLong.Error()},
		{"engine fails", errors.New("boom"), testModel, "hi", http.StatusInternalServerError, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &testEngine{startErr: tc.startErr}
			ts := newTestServer(t, e, nil)
			_, err := sdkClient(ts.URL).Completions.New(ctx, sdk.CompletionNewParams{
				Model:  sdk.CompletionNewParamsModel(tc.model),
				Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(tc.prompt)},
			})
			var apiErr *sdk.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("error %v (%T), want *openai.Error", err, err)
			}
			if apiErr.StatusCode != tc.status || apiErr.Message != tc.message {
				t.Fatalf("status %d message %q, want %d %q", apiErr.StatusCode, apiErr.Message, tc.status, tc.message)
			}
			if tc.startErr == nil && len(e.requests()) != 0 {
				t.Errorf("a refused request reached the engine")
			}
		})
	}
}

func TestSDKStreamError(t *testing.T) {
	e := &testEngine{failAt: 3, failErr: errors.New("device lost")}
	ts := newTestServer(t, e, nil)
	stream := sdkClient(ts.URL).Chat.Completions.NewStreaming(context.Background(), sdk.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []sdk.ChatCompletionMessageParamUnion{sdk.UserMessage("go")},
	})
	for stream.Next() {
	}
	var se *ssestream.StreamError
	if err := stream.Err(); !errors.As(err, &se) || !strings.Contains(se.Message, "device lost") {
		t.Fatalf("stream error %v, want the engine's error as a stream error", err)
	}
}

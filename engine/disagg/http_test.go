package disagg_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/engine/openai"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
)

// serve serves w's engine over the OpenAI-compatible HTTP API, as the
// worker command does, until the test ends.
func serve(t *testing.T, w *worker, tok tokenizer.Tokenizer) *httptest.Server {
	t.Helper()
	s, err := openai.New(openai.Config{Engine: w.Engine, Tokenizer: tok, ModelName: "tiny", ContextLen: tinyConfig.ContextLen, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// completion is the part of a /v1/completions answer the tests read.
type completion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Error            *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// complete posts a completions request and decodes the answer.
func complete(t *testing.T, ts *httptest.Server, body string) (int, completion) {
	t.Helper()
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("answer %q: %v", b, err)
	}
	return resp.StatusCode, c
}

// ids is p as a JSON list of token ids.
func ids(p []uint32) string {
	b, _ := json.Marshal(p)
	return string(b)
}

// Over HTTP, as a router drives vLLM workers: the prefill worker's answer
// to a do_remote_decode request (max_tokens 1) carries kv_transfer_params,
// which passed as they are to the decode worker with the same prompt give
// the aggregated worker's completion exactly, most of the prompt cached.
// Params that are not the prompt's, or not params at all, are refused
// with a 400 that says what is wrong, and the decode worker holds nothing
// after.
func TestHandoffOverHTTP(t *testing.T) {
	tok, err := tokenizer.O200k()
	if err != nil {
		t.Fatal(err)
	}
	cache := startCache(t)
	decodeW := newWorker(t, cache)
	agg, prefill, decode := serve(t, newWorker(t, ""), tok), serve(t, newWorker(t, cache), tok), serve(t, decodeW, tok)
	p := prompt(150, 300)
	rest := `"max_tokens": 12, "ignore_eos": true, "temperature": 0.7, "seed": 11`

	status, want := complete(t, agg, fmt.Sprintf(`{"model": "tiny", "prompt": %s, %s}`, ids(p), rest))
	if status != http.StatusOK || len(want.Choices) != 1 || want.Choices[0].Text == "" {
		t.Fatalf("aggregated worker: %d %+v", status, want)
	}
	status, pre := complete(t, prefill, fmt.Sprintf(`{"model": "tiny", "prompt": %s, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}}`, ids(p)))
	var params sched.KVTransferParams
	if status != http.StatusOK || json.Unmarshal(pre.KVTransferParams, &params) != nil || !params.DoRemotePrefill || len(params.BlockHashes) != 9 || params.CacheNode != cache {
		t.Fatalf("prefill worker: %d, kv_transfer_params %s; want do_remote_prefill, 9 blocks at %s", status, pre.KVTransferParams, cache)
	}
	status, got := complete(t, decode, fmt.Sprintf(`{"model": "tiny", "prompt": %s, %s, "kv_transfer_params": %s}`, ids(p), rest, pre.KVTransferParams))
	if status != http.StatusOK || len(got.Choices) != 1 || got.Choices[0] != want.Choices[0] {
		t.Fatalf("decode worker: %d %+v; the aggregated worker's %+v", status, got, want)
	}
	if d := got.Usage.PromptTokensDetails; d == nil || d.CachedTokens != 144 {
		t.Errorf("decode worker's usage %+v, want 144 of 150 prompt tokens cached", got.Usage)
	}

	other := prompt(150, 301)
	for _, tc := range []struct{ name, params, says string }{
		{"another prompt's blocks", string(pre.KVTransferParams), "block 0 is"},
		{"a namespace that is not hex", `{"do_remote_prefill": true, "kvstrata_namespace": "zz", "kvstrata_block_hashes": ["1"]}`, "namespace"},
		{"a block hash that is not hex", fmt.Sprintf(`{"do_remote_prefill": true, "kvstrata_namespace": %q, "kvstrata_block_hashes": ["not a hash"]}`, params.Namespace), "block 0"},
		{"both directions", `{"do_remote_prefill": true, "do_remote_decode": true}`, "both"},
		{"hashes as numbers", `{"do_remote_prefill": true, "kvstrata_block_hashes": [1, 2]}`, "kv_transfer_params"},
		{"not an object", `"garbage"`, "kv_transfer_params"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, c := complete(t, decode, fmt.Sprintf(`{"model": "tiny", "prompt": %s, "max_tokens": 4, "kv_transfer_params": %s}`, ids(other), tc.params))
			if status != http.StatusBadRequest || c.Error == nil || !strings.Contains(c.Error.Message, tc.says) {
				t.Errorf("answer %d %+v; want 400 saying %q", status, c.Error, tc.says)
			}
		})
	}
	if st := decodeW.Stats(); st.Pool.Free != st.Pool.Blocks || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after the refused requests the decode worker holds %d blocks, %d running, %d waiting", st.Pool.Blocks-st.Pool.Free, st.Running, st.Waiting)
	}
}

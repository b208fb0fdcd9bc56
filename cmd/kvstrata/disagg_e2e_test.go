package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Disaggregated serving with real processes: two cache nodes, a prefill
// worker using one, a decode worker using the other, and an aggregated
// worker for reference, all `kvstrata worker --model tiny`. The prefill
// worker's answer to a do_remote_decode request (max_tokens 1) carries
// kv_transfer_params that, passed as they are to the decode worker with the
// same prompt, give the aggregated worker's completion exactly, the decode
// worker computing only the prompt's last block. A prefill request that
// names no node has its blocks written at its own node, and the params name
// that node, which the decode worker loads them from; one that names the
// node nearest its decode worker (kvstrata_cache_node) has them written
// there.

// startTiny starts kvstrata worker --model tiny in role, using the cache
// node at cache ("" for none).
func startTiny(t *testing.T, role, cache string) *wproc {
	t.Helper()
	return startWorkerProcess(t, cache, "--role", role, "--model", "tiny")
}

// workerCompletion is the part of a /v1/completions answer the test reads.
type workerCompletion struct {
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
}

// postCompletion posts body to the worker's /v1/completions and fails the
// test unless it answers 200 with one choice.
func postCompletion(t *testing.T, w *wproc, body string) workerCompletion {
	t.Helper()
	resp, err := http.Post(w.url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var c workerCompletion
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &c) != nil || len(c.Choices) != 1 {
		t.Fatalf("POST %s %s: %d %s", w.url, body, resp.StatusCode, b)
	}
	return c
}

// transferParams are the kv_transfer_params fields the test reads.
type transferParams struct {
	DoRemotePrefill bool     `json:"do_remote_prefill"`
	BlockHashes     []string `json:"kvstrata_block_hashes"`
	CacheNode       string   `json:"kvstrata_cache_node"`
}

func TestDisaggregatedWorkersCompleteAsAnAggregatedOne(t *testing.T) {
	near, far := startNode(t, t.TempDir()), startNode(t, t.TempDir())
	agg := startTiny(t, "aggregated", "")
	prefill := startTiny(t, "prefill", far.grpc)
	decode := startTiny(t, "decode", near.grpc)

	const text = "The cache exists for inference workers. A prefill worker computes the keys and values " +
		"of every token of a prompt, layer by layer; the full blocks go to kvstrata, which keeps them in DRAM, " +
		"moves them to SSD as they cool, and to the object store after that. A decode worker asks for them."
	for i, tc := range []struct {
		name, sampling, node string
		at                   *proc
	}{
		{"greedy, at the prefill worker's node", `"temperature": 0`, "", far},
		{"sampled with a seed, at the node named for the decode worker", `"temperature": 0.8, "seed": 5`, near.grpc, near},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prompt := fmt.Sprintf("%d. %s %s", i, text, text) // new to every pool and node, 8 blocks and more
			rest := fmt.Sprintf(`"model": "kvstrata-tiny", "prompt": %q, "max_tokens": 16, "ignore_eos": true, %s`, prompt, tc.sampling)
			want := postCompletion(t, agg, "{"+rest+"}")

			named := ""
			if tc.node != "" {
				named = fmt.Sprintf(`, "kvstrata_cache_node": %q`, tc.node)
			}
			pre := postCompletion(t, prefill, fmt.Sprintf(`{"model": "kvstrata-tiny", "prompt": %q, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true%s}}`, prompt, named))
			var params transferParams
			n := want.Usage.PromptTokens
			if err := json.Unmarshal(pre.KVTransferParams, &params); err != nil || !params.DoRemotePrefill || len(params.BlockHashes) != n/16 || params.CacheNode != tc.at.grpc {
				t.Fatalf("prefill worker's kv_transfer_params %s; want do_remote_prefill, the %d full blocks of %d tokens, at %s", pre.KVTransferParams, n/16, n, tc.at.grpc)
			}

			got := postCompletion(t, decode, fmt.Sprintf(`{%s, "kv_transfer_params": %s}`, rest, pre.KVTransferParams))
			if got.Choices[0] != want.Choices[0] {
				t.Fatalf("decode worker: %+v; the aggregated worker's: %+v", got.Choices[0], want.Choices[0])
			}
			if d := got.Usage.PromptTokensDetails; d == nil || d.CachedTokens != (n-1)/16*16 {
				t.Errorf("decode worker's usage %+v; want %d of %d prompt tokens cached (onboarded)", got.Usage, (n-1)/16*16, n)
			}
		})
	}
}

// Package sched is a worker's engine loop: it admits requests, finds each
// prompt's longest cached prefix in the worker's GPU block pool and then in
// kvstrata, onboards what kvstrata has straight into pool blocks, batches
// sequences continuously (max-num-seqs, max-num-batched-tokens, chunked
// prefill), drives the model one step at a time, and offloads every new full
// block to kvstrata without making a request wait for it.
//
// The cache is optional and fallible: a worker without one, or with one that
// is down or slow, recomputes, counts it, and fails no request because of it.
package sched

import (
	"errors"

	"github.com/kvstrata/kvstrata/index"
)

// Request is one generation request, as the worker's HTTP API hands it over.
type Request struct {
	// ID names the request in logs and metrics; the engine does not
	// require it to be unique.
	ID string
	// Prompt is the prompt's token ids, at least one.
	Prompt []uint32
	// MaxTokens is how many tokens to generate at most, ≥ 1. Prompt plus
	// MaxTokens must fit the model's context length.
	MaxTokens int
	// Sampling chooses each next token.
	Sampling Sampling
	// StopTokens end generation when generated (the token is returned,
	// with FinishStop), unless IgnoreEOS.
	StopTokens []uint32
	// IgnoreEOS generates MaxTokens tokens whatever they are.
	IgnoreEOS bool
	// Transfer, if set, is disaggregated serving's kv_transfer_params.
	// With DoRemoteDecode the engine prefills the prompt, stores every full
	// block of it in kvstrata before it answers (at Transfer.CacheNode if
	// set), and its last Output's Transfer names those blocks for the
	// decode side. With DoRemotePrefill the engine first onboards the
	// blocks the params name (from CacheNode if set), then computes the
	// uncached remainder and decodes.
	Transfer *KVTransferParams
	// Routing, if set, is the request's routing override, for a router
	// in front of engines; an engine ignores it.
	Routing *Routing
}

// Sampling is how a request's next token is chosen.
type Sampling struct {
	// Temperature 0 is greedy (argmax); above 0 samples from the softmax
	// of logits/Temperature.
	Temperature float64
	// Seed seeds the request's sampler, so sampled output is reproducible.
	Seed uint64
}

// FinishReason says why a request ended, in OpenAI's words.
type FinishReason string

// Finish reasons.
const (
	FinishStop   FinishReason = "stop"   // a stop token was generated
	FinishLength FinishReason = "length" // MaxTokens reached
	FinishAbort  FinishReason = "abort"  // cancelled, or failed: see Output.Err
)

// Output is what a request produced since its previous Output. The engine
// never blocks on a slow reader: tokens the reader has not taken yet are
// merged into its next Output. The channel Generate returns is closed
// after the last Output, the one with Finish set.
type Output struct {
	// Tokens are the newly generated token ids, in order.
	Tokens []uint32
	// Finish is set on the last Output only.
	Finish FinishReason
	// Err is set, with FinishAbort, when the request failed.
	Err error
	// Usage is set on the last Output.
	Usage Usage
	// Transfer is set on the last Output of a DoRemoteDecode request: the
	// params the decode side needs.
	Transfer *KVTransferParams
}

// Usage counts a request's tokens, as OpenAI's usage reports them.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is how many prompt tokens were not computed: found in
	// the pool, or onboarded from kvstrata.
	CachedTokens int
	// OnboardedTokens is how many of CachedTokens came from kvstrata.
	OnboardedTokens int
}

// KVTransferParams are the kv_transfer_params of disaggregated serving, as
// vLLM's KV connectors and llm-d pass them through the OpenAI API: the
// prefill request sets DoRemoteDecode, and its response's params, with
// DoRemotePrefill set, go on the decode request.
type KVTransferParams struct {
	DoRemoteDecode  bool `json:"do_remote_decode,omitempty"`
	DoRemotePrefill bool `json:"do_remote_prefill,omitempty"`
	// Namespace is the blocks' namespace id (index.NamespaceID in hex).
	Namespace string `json:"kvstrata_namespace,omitempty"`
	// BlockHashes are the prompt's full blocks, in order (index.Hash in hex).
	BlockHashes []string `json:"kvstrata_block_hashes,omitempty"`
	// CacheNode is the kvstrata node (its gRPC address) the blocks were
	// written to, or, on a prefill request, should be written to: the one
	// nearest the decode worker. Empty: the worker's own cache client.
	CacheNode string `json:"kvstrata_cache_node,omitempty"`
}

// Errors Generate returns, for callers to test with errors.Is.
var (
	// ErrBadRequest: the request breaks a rule of Request; the message
	// says which.
	ErrBadRequest = errors.New("sched: bad request")
	// ErrTooLong: prompt plus MaxTokens exceed the context length; the
	// message says the limit.
	ErrTooLong = errors.New("sched: request exceeds the context length")
	// ErrOverloaded: the waiting queue is full; retry later.
	ErrOverloaded = errors.New("sched: too many waiting requests")
	// ErrClosed: the engine is shutting down.
	ErrClosed = errors.New("sched: engine closed")
)

// Block is one full block of a prompt, as the engine hands it to its
// Connector to store.
type Block struct {
	Hash index.Hash
	// Parent is the block before it in its chain, if HasParent.
	Parent    index.Hash
	HasParent bool
	// Data is the block's KV, model.Layout.BlockBytes() bytes; the
	// Connector owns it once given.
	Data []byte
}

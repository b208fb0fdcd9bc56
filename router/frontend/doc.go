// Package frontend is the router's serving half: a Router is the
// openai.Engine of `kvstrata frontend`, so the frontend is an
// engine/openai Server — the whole vLLM-compatible API, tokenized once
// there — whose engine routes each request to a worker.
//
// # Routing
//
// For each request the Router hashes the prompt's full blocks in the
// workers' namespace (Config.Namespace), asks its KV index (router/kvindex,
// fed by one kvevents.Subscriber per worker; a publisher restart or lost
// events clear that worker) for each worker's overlap, and a cache node
// (api/client Lookup, bounded by CacheTimeout: a slow or failed lookup
// gives no tier credit) where the rest of the prefix lies per tier, and
// lets router/policy choose. It then POSTs the worker's /v1/completions
// with the prompt's token ids, streamed, with vLLM's return_token_ids, and
// turns the chunks' token ids into sched.Outputs. The policy's Sequence
// sees the first token and the end.
//
// # Disaggregated serving
//
// A list of prefill and decode workers (WorkerSpec.Role; aggregated ones
// may not be mixed in a static list; discovered workers come in every
// role, see discover.go) serves disaggregated, as vLLM's and llm-d's
// kv_transfer_params do it, the handoff going through kvstrata. The decode
// worker is chosen by its load (least-loaded); when the prompt's part it
// would compute — less its pool overlap and the cache tiers' credit
// (policy.Router.Uncached) — is at most DisaggMinUncached tokens, it
// prefills the prompt itself (route "local"). Otherwise a prefill worker
// chosen by the policy (kv-tiered: by overlap) runs the prompt, not
// streamed, with max_tokens 1 and kv_transfer_params {do_remote_decode:
// true}: it stores the prompt's full blocks at a cache node and answers
// params naming them, which go with the request to the decode worker; it
// loads the blocks and streams the answer (route "disaggregated"). Both
// workers' Sequences carry their share of the load: the prefill worker's
// ends with its answer, the decode worker's predicts only what it computes.
// A prefill worker that fails moves the prefill to another (at most
// MaxMigrations times); when none is left, or one refuses the request,
// the decode worker prefills. A decode worker that fails moves the request
// to another decode worker, as above, with the same params. A request that
// brings its own kv_transfer_params goes to a decode worker as it is.
//
// # Failures
//
// A worker whose connection fails, whose answer is a 5xx, or whose stream
// breaks leaves the candidates at once; so does one whose /health fails
// (asked every HealthInterval). An unhealthy worker is probed with a
// doubling backoff and comes back when /health answers 200. A request
// whose worker fails is moved: its prompt plus the tokens already produced
// go to another worker with max_tokens reduced by them — that worker finds
// the prompt's blocks in kvstrata rather than recomputing them — and the
// client's stream goes on, at most MaxMigrations times per request. A
// worker's 503 (its queue full) moves the request without marking the
// worker unhealthy. kvstrata_frontend_migrations_total counts moves by
// cause.
//
// When every worker is busy, a request waits in a queue of QueueSize for
// up to QueueWait; past either it fails with an error wrapping
// sched.ErrOverloaded, which the API answers 503 with Retry-After.
//
// # Metrics
//
// Requests by worker and outcome, TTFT, inter-token latency, request
// duration and input and output lengths per worker (histograms), routing
// decisions by worker and policy with the overlap found per tier, cache
// lookups, migrations by cause, queue depth and worker health: the series
// named kvstrata_frontend_*.
package frontend

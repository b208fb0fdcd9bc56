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

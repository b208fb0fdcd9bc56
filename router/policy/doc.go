// Package policy chooses the worker that serves a request: the routing
// decision of kvstrata's router, as pure logic with no I/O. The caller (the
// frontend, or `kvctl replay --simulate` in virtual time) looks up where the
// prompt's blocks are — each worker's GPU pool from the KV-event index
// (router/kvindex), the cache tiers from a cache Lookup — and hands this
// package one Candidate per worker; Router.Choose returns the Decision and
// records the request as an active Sequence of the chosen worker, which the
// caller ends with Sequence.FirstToken and Sequence.Done.
//
// # Cost
//
// For a prompt of T tokens in N full blocks of B tokens, a worker w with
// o blocks of the prompt's prefix in its own pool and, beyond them, n_t
// further blocks of the prefix in cache tier t costs
//
//	cost(w) = OverlapWeight · (active_prefill_tokens(w) + new_tokens(w)) / B
//	        + active_blocks(w)
//
//	new_tokens(w) = B · Σ_{i<N} (1 − credit_i(w)) + (T − N·B)
//
// where the credit of the block at position i is
//
//	1                                          if it is in w's pool (i < o);
//	max(0, 1 − restore_t / recompute_i)        if it is restored from tier t;
//	0                                          otherwise;
//
//	recompute_i = P((i+1)·B) − P(i·B)           (P: the worker's prefill profile,
//	                                            sim.Profile.Prefill, ms of T new tokens:
//	                                            Candidate.Prefill, else Config.Profile)
//	restore_t   = BlockBytes / Bandwidth_t + Latency_t / n_t
//
// recompute_i is the marginal prefill time of the block's tokens at its
// position (later blocks attend to more context and cost more when the
// profile is convex); restore_t is the time to fetch one block in a run of
// n_t blocks from tier t, the tier's latency paid once per run. A tier
// slower than recomputing earns nothing. The tier blocks are taken to lie
// right after the pool's, fastest tier first (hbm, dram, ssd, s3): the
// hotter a block, the earlier in the prefix it tends to be. The counts must
// describe a contiguous prefix — a block restored after a gap saves nothing.
//
// active_prefill_tokens and active_blocks are the worker's load: the
// Sequences this Router routed to it (prefill tokens predicted at routing,
// until the first token; the blocks the prompt adds to the pool — all of
// them, the partial last one included, less the Overlap it shares with
// blocks already there — until Done), plus Candidate.Load, load the Router
// cannot see (another frontend replica's). Blocks a sequence generates
// are not counted: the prompt dominates, and the caller may add them
// through Candidate.Load.
//
// Worked example, with the defaults (the sim profile P(x) = 16.50142 +
// 1.518344e-2·x + 4.209989e-7·x² ms, B = 16, 4 KiB blocks, DRAM 2 GB/s +
// 35 µs): a prompt of 200 tokens (N = 12, tail 8) on an idle worker holding
// 4 blocks in its pool and with 8 more in DRAM. Block 4 recomputes in
// P(80) − P(64) = 0.2439 ms; restoring it costs 4096 B / 2 GB/s + 35 µs / 8
// = 6.42 µs, so its credit is 1 − 0.00642 / 0.2439 = 0.974; blocks 5…11
// earn a little more (their recompute grows to 0.2454 ms), 7.79 blocks'
// worth in all. new_tokens = 16 · (8 − 7.79) + 8 = 11.37 tokens, cost =
// 1 · 11.37 / 16 = 0.71 blocks. The same worker knowing nothing of the
// cache (kv-hbm) costs (8 · 16 + 8) / 16 = 8.5 blocks, and one with nothing
// in its pool, restoring all 12 blocks from DRAM, 0.74.
//
// # Policies
//
// A Policy names which terms count, for comparing routers on one trace:
// kv-tiered (the default) counts everything above; kv-hbm only the pool
// overlap, as NVIDIA Dynamo's and llm-d's routers do; least-loaded no
// overlap at all (every worker pays the whole prompt); random picks
// uniformly and round-robin in turn. Every policy first drops the
// candidates that are unhealthy (Candidate.Unhealthy, set by the caller's
// failure detection) or busy (active blocks ≥ BusyBlockFraction ·
// Capacity, or active prefill tokens ≥ BusyPrefillTokens). When none
// remains, Choose returns an error wrapping ErrAllBusy (some were busy:
// queue the request or answer 503 with Retry-After) or ErrNoWorkers (none
// is healthy).
//
// # Selection
//
// With Temperature 0 the cheapest candidate wins. Costs within 1e-9
// (relative) of the cheapest are a tie, broken by TieBreak: TieRandom (the
// default) picks uniformly among them with the Router's seeded generator —
// two frontend replicas with the same view then do not both pile onto the
// same worker — and TieLowestIndex picks the first in the candidates'
// order. With Temperature τ > 0 candidate w is drawn with probability
//
//	p(w) ∝ exp(−(cost(w) − cost_min) / (τ · (cost_max − cost_min)))
//
// (uniform when every cost is equal): τ is relative to the spread of the
// costs, so at τ = 1 the costliest is e times less likely than the
// cheapest, whatever the model and load. The generator is seeded
// (Config.Seed): the same calls in the same order give the same choices.
//
// # Use
//
// The frontend keeps one Router per model and, per request, builds the
// candidates in a stable order (sorted by worker) from its worker set, its
// failure detector (Unhealthy), the KV index (Overlap) and one cache Lookup
// (TierCounts), maps the request's routing fields to an Override, and calls
// Choose. ErrAllBusy means wait in the queue or answer 503 with
// Retry-After. It calls Seq.FirstToken on the first streamed token and
// Seq.Done when the stream ends, however it ends; to re-route a request
// whose worker died it calls Done, marks that worker Unhealthy and chooses
// again with the prompt plus the tokens produced. Disaggregated serving can
// choose the prefill worker with kv-tiered and the decode worker with an
// Override of least-loaded. `kvctl replay --simulate` runs one Router per
// policy over the same trace; with a fixed Seed and the same calls in the
// same order, its choices are the same on every run.
//
// # Concurrency
//
// A Router is safe for concurrent use. Choose computes the costs, picks
// and records the new Sequence under one lock, so requests routed in a
// burst see each other's predicted load. A Sequence stays active until
// Done: there is no time limit that would forget a request still running.
package policy

// Package simulate is `kvctl replay --simulate`: the replay of a request
// trace (package trace, Mooncake's format) against simulated workers in
// virtual time, in one process, once per routing policy, so that the
// policies are compared on the same trace with everything else equal. It
// runs the real code wherever the live deployment has code:
//
//   - Routing: one router/policy.Router per policy, its candidates built as
//     router/frontend builds them — each worker's pool overlap from a
//     router/kvindex.Index fed with the workers' own pool events (the vLLM
//     events kvevents.PoolEvent makes of them, one batch per engine step,
//     applied when the step ends), the cache tiers of the prompt's leading
//     blocks from the cache's hierarchy (a cluster Lookup), Capacity the
//     pool — and Sequence.FirstToken and Done called at the virtual times
//     of the first token and the last. When every worker is busy (the
//     router's thresholds) requests wait, in arrival order, and are routed
//     again whenever a request reaches its first token or its end; the
//     wait is part of their TTFT.
//   - Workers: engine/sched's scheduler in its driven mode (NewDriven, one
//     loop iteration per Step, the Connector called inline) over the sim
//     model (engine/model/sim) and engine/pool's block pool: admission,
//     prefix reuse, chunked prefill, continuous batching, preemption,
//     offload of every new full block, onboarding from the cache. Each
//     worker has its own sim.VirtualClock: the model sleeps its modelled
//     step times on it, and the Connector its modelled restore times.
//   - The cache: tiers.Hierarchy, the cache node's own placement code —
//     new blocks in DRAM, the eviction policy's victims demoted to the SSD
//     and from there to S3, hits below DRAM promoted — over tiers/sim's
//     ghost tiers, which keep a block's header and no bytes (each block
//     counts one unit, capacities are in blocks). The hierarchy was
//     chosen over tiers/sim's MultiTier because MultiTier replays a trace
//     request by request with its own store and lookup rules; here the
//     workers store what they compute and load what they miss, through
//     the same Connector calls a live worker makes, and only the
//     hierarchy's own rules should decide where a block sits. The
//     cluster is modelled as one hierarchy whose capacities are the
//     cluster's totals.
//
// # Baselines: the deployment without kvstrata
//
// Config.Baselines replays policies a second time on workers that have no
// cache: no Connector, so nothing is offloaded and nothing onboarded, and
// a router that sees no cache tiers (only the workers' own pools, through
// their KV events). That is today's deployment — a KV-aware router over
// vLLM workers without KV offloading, or a random one — while the rows of
// Config.Policies all share kvstrata's cache: there, even random routing
// restores what any worker computed before. A row says which it was in
// Row.Cache ("kvstrata" or "none"); a baseline's cache tiers' hit tokens,
// offloaded blocks and cache timeouts are zero.
//
// # Time
//
// A discrete-event loop advances one global virtual time, starting at the
// trace's timestamp 0: request i arrives at its timestamp / Speedup; a
// worker's event is the end of its previous step, when that step's outputs
// and pool events are delivered, and the start of its next one, which
// advances the worker's clock by the step's modelled time (the sim
// model's profile: prefill time of the step's new tokens, decode time of
// the batch's KV) plus the restore time of what it onboarded. At equal
// times arrivals come first, then workers in the order their events were
// scheduled. Nothing is random but the router's seeded choices and the
// seeded prompts, so the same Config and trace give the same rows, byte
// for byte, on every run. TTFT is from arrival to the end of the step that
// produced the first token, ITL the gaps between later tokens, E2E
// arrival to the last token; they are summarized by replay.Summarize, as
// the live replay's are.
//
// # Scaling: a scaler in the loop, and the SLO
//
// Config.Scalers replays each policy once per NamedScaler. Every
// Config.ScaleInterval (30 s) a run shows its Scaler the Window that just
// ended (arrivals, finished requests, prompt, cached and output tokens,
// TTFT and ITL sums, the queue, the pools' usage and the workers in each
// state) and clamps its answer to [MinWorkers, MaxWorkers]. A worker
// added is starting: it counts in the worker-seconds at once and becomes
// a routing candidate Config.StartupDelay (60 s) later. Scaling down
// cancels starting workers first, newest first, then drains the serving
// workers with the fewest requests: a draining worker leaves the
// candidates at once, finishes its requests, then retires (the router's
// index forgets it, its engine closes); the blocks it offloaded stay in
// the cache, so no computed prefix is lost. Worker ids only grow. At
// equal times: arrivals, ticks, readiness, steps. Ticks stop when the last
// request ends. Package simulate does not import the planner: kvctl
// adapts planner.Planner, planner.Reactive and static sizings to Scaler.
//
// Row.SLOAttainment is the share of requests within Config.SLO: TTFT ≤
// max(SLO.TTFT, SLO.TTFTSlack × TTFT alone) and mean ITL ≤ SLO.ITL, where
// TTFT alone is planner/perf's PrefillTime of the request's uncached
// prompt tokens on the run's profile and batch limits; failed requests
// are misses. Row.WorkerSeconds is every worker's time from its add to its
// retirement or the run's end, WorkersMean that over the duration.
//
// # What is modelled, and the defaults
//
// Prompts are made from hash_ids by replay.Prompts, the live replay's
// code, so the same hash id is the same tokens and prefixes are shared
// exactly as the trace shares them; every request generates output_length
// tokens (ignore_eos).
//
// The workers keep 4 bytes of KV a token (the sim model's bytes, one
// layer): the restore times use the modelled size, Config.TokenBytes a
// token (default 128 KiB, Llama-3.1-8B in fp16: 32 layers × 8 KV heads ×
// head dim 128 × K and V × 2 bytes), so a block of 16 tokens is 2 MiB.
// Each worker's pool is Config.PoolTokens (default 131072 tokens: 16 GiB,
// what a 40 GB A100 keeps for KV after an 8B model's 16 GB of weights and
// activations; also the longest request of the conversation trace).
//
// Restoring n blocks in one run from a tier takes latency + n × block
// bytes / bandwidth; runs from different tiers each pay their latency.
// Defaults (DefaultTiers), per tier: DRAM 25 GB/s and 10 µs (host memory to
// GPU over PCIe 5.0 x16, as CPU-offload connectors reach), SSD 6 GB/s and
// 100 µs (an NVMe 4.0 drive's sequential read), S3 2 GB/s and 20 ms (an
// object store over a 25 Gb/s NIC, first byte after 20 ms). The routers
// are given the same figures (policy.Config.Tiers) and the same profile,
// as a deployment would feed them its measured ones. An onboarding is cut
// at Config.CacheTimeout of modelled time, as the engine's timeout cuts a
// slow cache, and the rest is recomputed. Offloads are write-behind and
// cost the worker no time. Capacities default to 1 TiB of DRAM, 8 TiB of
// SSD and an unbounded S3 for the cluster, with LRU eviction.
//
// Restore time is charged to the worker's clock between its steps: a
// live worker's onboarding overlaps other requests' steps, the simulated
// one's does not, which makes onboarding slightly costlier here than live.
//
// Not modelled: the network between the frontend and the workers, the
// frontend's own queue limits (the simulated queue has no bound and no
// timeout), worker failures and migrations, and disaggregated serving.
package simulate

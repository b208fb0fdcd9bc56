// Package disagg holds the tests and benchmarks of disaggregated serving
// through the cache, with every part real and in one process: cache nodes
// as kvstrata serve runs them (a one-node Raft cluster each), and prefill,
// decode and aggregated workers' engines (engine/sched) on the tiny model,
// each with its own connector (engine/kvconn) over real sockets. A prefill
// engine given kv_transfer_params do_remote_decode stores the prompt's full
// blocks and answers the params a decode engine onboards them with; the
// decode engine's output must be the aggregated engine's, token for token.
//
// The package has no code of its own: the worker command
// (kvstrata worker) wires the same parts.
package disagg

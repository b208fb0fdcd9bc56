// Package kvindex is the router's index of which worker holds which blocks
// in its GPU block pool, fed by the workers' KV events (engine/kvevents).
//
// # Keys
//
// Blocks are keyed by kvstrata's own chained hash (index.ChainHash), computed
// here from the token ids each BlockStored carries and the kvstrata hash of
// its parent, starting from the worker's namespace seed. The engine's own
// block hashes — vLLM's sha256 byte strings, Python's hash() integers, ours —
// are opaque: they are kept per worker only to find a stored block's parent
// (parent_block_hash) and the blocks a BlockRemoved names. So two engines
// that hash their own way, and the cache cluster's directory, all name the
// same prompt prefix by the same key, and a request's hashes
// (index.Namespace.Hashes of its tokens) are looked up as they are.
//
// An engine hash is read as 64 bits: an integer as its 64-bit two's
// complement, a byte string as its last 8 bytes, big-endian (shorter ones
// padded with zeros in front), as llm-d reads vLLM's sha256 digests and as
// kvevents.PoolSink writes its byte-string form.
//
// # Workers and events
//
// A worker is the caller's small WorkerID, registered with the namespace
// (model, KV layout, block size) its pool's blocks belong to. Apply applies
// one batch of its events in order:
//   - BlockStored adds its blocks, each the parent of the next. It is
//     refused (counted in Stats.Refused, nothing changes) when its
//     block_size is not the namespace's, when its token ids do not fill
//     exactly its blocks or do not fit kvstrata's 32-bit token ids, or when
//     it names a LoRA adapter (an adapter's KV is not the base model's, and
//     nothing names it in the namespace). Blocks of another medium than the
//     GPU (vLLM's CPU offloading) are not the pool's and are ignored
//     (Stats.OtherMedium), as are BlockRemoved events of another medium.
//   - A BlockStored whose parent the index does not hold for that worker —
//     vLLM sends one after events were lost, or the parent was pruned — is
//     an orphan: its blocks cannot be keyed (the chain needs the parent's
//     kvstrata hash), so they are counted (Stats.Orphans) and skipped. The
//     index then knows less than the worker holds, never more; a later
//     BlockStored that starts from a known block, or from no parent, is
//     indexed as usual.
//   - BlockRemoved removes the blocks it names (unknown names are ignored);
//     AllBlocksCleared clears the worker.
//
// # Queries
//
// Overlap answers, for a request's chain of hashes, the length of the
// longest prefix of the chain that each worker holds: what the routing cost
// needs. It walks the chain once, keeping the set of workers still matching
// as a bitmap and intersecting it with each block's bitmap of holders, and
// stops at the first block no candidate holds. Each block is one lookup in
// an open-addressing table whose entry carries the first word of the
// block's bitmap (one memory access for up to 64 workers; more workers add
// a word per 64), and the lookups are issued eight at a time so that their
// cache misses overlap.
//
// # Memory
//
// Each namespace holds at most Config.MaxEntries (block, worker) entries.
// Past it, blocks are pruned with the CLOCK algorithm, an approximation of
// least recently used: a block's reference bit is set when it is stored or
// found by a query, the clock hand clears set bits and drops the first
// block it finds clear, with every worker's entry for it, until the
// namespace is back under 15/16 of the cap. Pruning only forgets: an
// overlap may become shorter, never longer than what a worker holds.
// Stats.Pruned counts the entries dropped. BenchmarkBytesPerBlock measures
// the memory of an indexed block: about 120 bytes for a block one worker
// holds, 155 for one two workers hold (the table at 37–75 % load, the
// block's slot, its bitmap, each holder's engine-hash entry).
//
// # Concurrency
//
// An Index is safe for concurrent use. Each namespace has a reader/writer
// lock: Apply, ClearWorker and RemoveWorker take it for writing, Overlap for
// reading (a query's reference bits are set atomically), so queries run in
// parallel with each other and wait only for the batch being applied. The
// set of workers and namespaces is an immutable snapshot replaced on
// Register and RemoveWorker.
//
// # How the frontend uses it
//
// The frontend registers each worker (its id, and its model's namespace) and
// runs one kvevents.Subscriber per worker, whose callback calls
// Apply(worker, batch); OnReset (the worker's publisher restarted, its pool
// is empty) and OnLost (batches were lost, so blocks they removed may still
// be indexed) call ClearWorker, so that the index never overstates what a
// worker holds; it relearns from the events that follow. A worker that
// leaves is RemoveWorker'd. To route a request, it hashes the prompt's tokens
// once (index.Namespace.Hashes) and calls Overlap with the model's
// namespace; the cost of each worker uses the blocks matched.
package kvindex

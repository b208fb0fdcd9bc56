package sched

import (
	"context"

	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// Connector is the engine's way to kvstrata (engine/kvconn implements it
// over api/client). Every method may fail or find nothing; the engine then
// recomputes. Methods are called from the engine loop and must not block
// it for longer than their context allows.
type Connector interface {
	// Lookup reports how many leading blocks of hashes the cache holds and
	// can serve now.
	Lookup(ctx context.Context, ns index.NamespaceID, hashes []index.Hash) (int, error)
	// Load fetches the leading blocks of hashes, in order, block i into
	// dst(i) (BlockBytes long), stopping at the first block it cannot
	// fetch intact; it returns how many leading blocks it loaded. A node
	// address, if not empty, is where to fetch them from (disaggregation's
	// CacheNode); empty, wherever the cache finds them.
	Load(ctx context.Context, node string, ns index.NamespaceID, hashes []index.Hash, dst func(i int) []byte) (int, error)
	// Offload stores blocks in the background and returns at once; under
	// pressure it may drop them (and count it). It owns blocks.
	Offload(ns index.NamespaceID, blocks []Block)
	// Store stores blocks now, at node if not empty (else at the worker's
	// own cache node), and returns once they are stored, with the address
	// of the node that holds them: disaggregated prefill's write-through.
	// The decode side's params name that node, so that it loads the
	// blocks from there at once rather than ask a directory that may not
	// list them yet.
	Store(ctx context.Context, node string, ns index.NamespaceID, blocks []Block) (string, error)
}

// EventSink receives the worker's block pool events (engine/kvevents
// implements it, publishing them as vLLM's KV events). Both methods are
// called from the engine loop and must return at once.
type EventSink interface {
	// Event is one pool event, in the order the pool made them; the sink
	// owns its slices.
	Event(pool.Event)
	// Flush ends an engine step that produced events: what the sink holds
	// is one batch.
	Flush()
}

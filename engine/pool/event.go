package pool

import "github.com/kvstrata/kvstrata/index"

// EventKind says what changed in the pool's cache.
type EventKind uint8

// The kinds of Event, named after vLLM's KV events.
const (
	// BlockStored: Hashes became findable, in chain order.
	BlockStored EventKind = iota + 1
	// BlockRemoved: Hashes were evicted (their blocks reused).
	BlockRemoved
	// AllBlocksCleared: Reset dropped every hash.
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "EventKind(?)"
}

// Event is one change to the set of cached hashes, as vLLM's KV events
// report it; the publisher adds what the pool does not know (medium, LoRA
// id, data-parallel rank). The listener owns the slices.
type Event struct {
	Kind EventKind
	NS   index.NamespaceID // BlockStored, BlockRemoved
	// Hashes: BlockStored's new blocks in chain order, each the parent of
	// the next; BlockRemoved's evicted blocks.
	Hashes []index.Hash
	// Parent is the hash of the block before Hashes[0] when HasParent;
	// a BlockStored without a parent starts its sequence (vLLM's
	// parent_block_hash None).
	Parent    index.Hash
	HasParent bool
	// Tokens are BlockStored's token ids, BlockTokens for each of Hashes.
	Tokens      []uint32
	BlockTokens int
}

// Package kvevents holds vLLM's KV cache events as vLLM publishes them:
// the events (BlockStored, BlockRemoved, AllBlocksCleared), the batch that
// carries them, their msgpack encodings, the ZeroMQ message framing of
// vLLM's ZmqEventPublisher, and a Publisher that does what it does (PUB
// socket, replay ROUTER socket) over pure-Go ZeroMQ. On a worker, a
// PoolSink turns its block pool's events into batches for a Publisher
// without blocking the engine loop; on a router, a Subscriber follows one
// worker's events in order, replaying what it missed. A Publisher listens,
// or connects (Connect) to a router's Listener: one listening SUB socket
// for many workers, whose Subscribers it feeds by topic.
//
// vLLM has encoded its events in two ways. Older versions declare them as
// msgspec structs with array_like=True and tag=True, so an event is an
// array whose first element is its class name ("tagged arrays"); newer ones
// drop array_like, so an event is a map whose "type" key names the class.
// Encode writes either (see Encoding); Decode reads both, and also a batch
// written as a map ({"ts", "events", "data_parallel_rank"}), as the newest
// vLLM writes it.
//
// Apart from the Publisher, the Listener and the PoolSink (whose methods
// are safe for concurrent use) and the Subscriber (see its doc), everything here is a plain value or a pure function: safe to use from
// any number of goroutines as long as no one modifies a value being encoded.
package kvevents

import (
	"bytes"
	"encoding/hex"
	"strconv"
)

// MediumGPU is the medium vLLM names for blocks in the engine's own GPU
// block pool.
const MediumGPU = "GPU"

// Event is one KV cache event: *BlockStored, *BlockRemoved or
// *AllBlocksCleared.
type Event interface {
	// Tag is the event's class name in vLLM, which both encodings carry.
	Tag() string
}

// The events' class names, as vLLM writes them.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// BlockStored says that full blocks entered the cache: BlockHashes[i]
// holds tokens TokenIDs[i*BlockSize:(i+1)*BlockSize], each block's parent
// is the one before it and the first one's is ParentBlockHash (nil for
// a block at the start of a prompt).
type BlockStored struct {
	BlockHashes     []Hash
	ParentBlockHash *Hash // nil: no parent
	TokenIDs        []int64
	BlockSize       int64
	LoraID          *int64  // nil: no LoRA adapter
	Medium          *string // nil: not said (vLLM before it had the field); else e.g. MediumGPU
}

// BlockRemoved says that blocks left the cache (of Medium, when given).
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      *string
}

// AllBlocksCleared says that every block left the cache.
type AllBlocksCleared struct{}

// Tag implements Event.
func (*BlockStored) Tag() string { return TagBlockStored }

// Tag implements Event.
func (*BlockRemoved) Tag() string { return TagBlockRemoved }

// Tag implements Event.
func (*AllBlocksCleared) Tag() string { return TagAllBlocksCleared }

// Batch is what one ZeroMQ message carries: the events of one engine step.
type Batch struct {
	TS               float64 // seconds since the Unix epoch, as Python's time.time()
	Events           []Event
	DataParallelRank *int64 // nil: not said (nil on the wire)
}

// Hash is a block hash as vLLM publishes it: an integer (Python's int,
// from -2^63 up to 2^64-1; older vLLM) or a byte string (sha256 digests in
// newer vLLM). Its zero value is the integer 0. Hashes are comparable
// with Equal, not ==.
type Hash struct {
	b   []byte // the byte string; nil for an integer
	isB bool
	neg bool   // an integer below zero: n holds its int64 bits
	n   uint64 // an integer's value
}

// IntHash is the integer hash v.
func IntHash(v int64) Hash {
	if v < 0 {
		return Hash{neg: true, n: uint64(v)}
	}
	return Hash{n: uint64(v)}
}

// UintHash is the integer hash v.
func UintHash(v uint64) Hash { return Hash{n: v} }

// BytesHash is the byte-string hash b (b is kept, not copied).
func BytesHash(b []byte) Hash {
	if b == nil {
		b = []byte{}
	}
	return Hash{b: b, isB: true}
}

// IsBytes reports whether h is a byte string.
func (h Hash) IsBytes() bool { return h.isB }

// Bytes is h's byte string; nil for an integer hash.
func (h Hash) Bytes() []byte { return h.b }

// Int64 is h as an int64, and whether it is an integer that fits one.
func (h Hash) Int64() (int64, bool) {
	if h.isB || !h.neg && h.n > 1<<63-1 {
		return 0, false
	}
	return int64(h.n), true
}

// Uint64 is h as a uint64, and whether it is a non-negative integer.
func (h Hash) Uint64() (uint64, bool) {
	if h.isB || h.neg {
		return 0, false
	}
	return h.n, true
}

// Equal reports whether h and o are the same hash: both integers of the
// same value or both the same byte string.
func (h Hash) Equal(o Hash) bool {
	if h.isB || o.isB {
		return h.isB && o.isB && bytes.Equal(h.b, o.b)
	}
	return h.neg == o.neg && h.n == o.n
}

// String is h in decimal, or in hex prefixed with "0x" for a byte string.
func (h Hash) String() string {
	switch {
	case h.isB:
		return "0x" + hex.EncodeToString(h.b)
	case h.neg:
		return strconv.FormatInt(int64(h.n), 10)
	}
	return strconv.FormatUint(h.n, 10)
}

package kvevents

import (
	"encoding/binary"

	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

// PoolEvent is pool event e as the vLLM KV event a PoolSink publishes for
// it, its blocks on medium and its hashes written in form; nil for a kind
// it does not know. An in-process consumer — the simulated replay, which
// feeds its router's index without a socket — applies the same events.
func PoolEvent(e pool.Event, medium string, form HashForm) Event {
	switch e.Kind {
	case pool.BlockStored:
		ev := &BlockStored{
			BlockHashes: hashesIn(form, e.Hashes),
			TokenIDs:    make([]int64, len(e.Tokens)),
			BlockSize:   int64(e.BlockTokens),
			Medium:      &medium,
		}
		if e.HasParent {
			p := hashIn(form, e.Parent)
			ev.ParentBlockHash = &p
		}
		for i, t := range e.Tokens {
			ev.TokenIDs[i] = int64(t)
		}
		return ev
	case pool.BlockRemoved:
		return &BlockRemoved{BlockHashes: hashesIn(form, e.Hashes), Medium: &medium}
	case pool.AllBlocksCleared:
		return &AllBlocksCleared{}
	}
	return nil
}

func hashesIn(form HashForm, hs []index.Hash) []Hash {
	out := make([]Hash, len(hs))
	for i, h := range hs {
		out[i] = hashIn(form, h)
	}
	return out
}

func hashIn(form HashForm, h index.Hash) Hash {
	if form == HashBytes {
		return BytesHash(binary.BigEndian.AppendUint64(nil, uint64(h)))
	}
	return UintHash(uint64(h))
}

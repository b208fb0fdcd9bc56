package tiers

import (
	"sync"

	"github.com/kvstrata/kvstrata/index"
)

// readIndex is what a read needs of each key the levels hold: its entry
// and which levels hold it (entry.in), in shards under locks of their own,
// so that a read finds its level without the hierarchy's lock. Writers
// keep it in step with the entries (publishLocked) under the hierarchy's
// lock, in the same hold that changes them; a read therefore sees a copy
// recorded only once its tier holds it, as it did under the lock, and may
// still see one its tier has just given up, which it handles as before
// (read).
type readIndex struct {
	shards [readShards]readShard
}

const readShards = 64

type readShard struct {
	mu sync.RWMutex
	m  map[index.Key]held
	_  [32]byte // the next shard's lock on a cache line of its own
}

// held is a key's entry and the levels that hold it.
type held struct {
	e  *entry
	in uint8
}

func (x *readIndex) shard(key index.Key) *readShard {
	return &x.shards[(uint64(key.Hash)^uint64(key.NS))%readShards]
}

// get returns what the index holds of key: the zero held if no level
// holds it.
func (x *readIndex) get(key index.Key) held {
	s := x.shard(key)
	s.mu.RLock()
	v := s.m[key]
	s.mu.RUnlock()
	return v
}

func (x *readIndex) set(key index.Key, v held) {
	s := x.shard(key)
	s.mu.Lock()
	if v.in == 0 {
		delete(s.m, key)
	} else {
		if s.m == nil {
			s.m = make(map[index.Key]held)
		}
		s.m[key] = v
	}
	s.mu.Unlock()
}

// publishLocked makes the read index agree with the entries on key: call
// it, holding the hierarchy's lock exclusively, after any change of which
// levels hold key or of its entry.
func (h *Hierarchy) publishLocked(key index.Key) {
	if e := h.entries[key]; e != nil {
		h.readable.set(key, held{e: e, in: e.in})
	} else {
		h.readable.set(key, held{})
	}
}

// Package index names blocks and knows where they are.
//
// A block is named by a chained 64-bit hash: the hash of block i covers the
// hash of block i-1 and the token ids of block i, so one hash names a block
// together with its whole prefix:
//
//	h[0] = xxhash64(le64(seed) ‖ le32(tokens of block 0))
//	h[i] = xxhash64(le64(h[i-1]) ‖ le32(tokens of block i))
//
// where seed is the namespace's Seed, le64 and le32 are little-endian
// encodings, and a trailing partial block is never hashed. Engines that hash
// their own way may hand in their own 64-bit ids: below this file, ids are
// opaque.
//
// The Directory maps keys to the locations (node, tier) that hold a copy and
// answers longest-prefix lookups. It is safe for concurrent use.
package index

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Hash names a block and its whole prefix within a namespace.
type Hash uint64

// String formats h as 16 hex digits, the form the CLI and logs use.
func (h Hash) String() string { return fmt.Sprintf("%016x", uint64(h)) }

// NamespaceID identifies a namespace; it is the namespace's seed.
type NamespaceID uint64

func (n NamespaceID) String() string { return fmt.Sprintf("%016x", uint64(n)) }

// Key is the full identity of a block: hashes from two namespaces never
// collide as keys, even when an engine hands in its own ids.
type Key struct {
	NS   NamespaceID
	Hash Hash
}

func (k Key) String() string { return k.NS.String() + "/" + k.Hash.String() }

// ChainHash returns the hash of a block whose predecessor hashed to prev (or,
// for the first block of a chain, whose namespace seed is prev).
func ChainHash(prev uint64, block []uint32) Hash {
	var buf [8 + 4*256]byte
	d := xxhash.New()
	binary.LittleEndian.PutUint64(buf[:8], prev)
	n := 8
	for _, t := range block {
		if n == len(buf) {
			_, _ = d.Write(buf[:n])
			n = 0
		}
		binary.LittleEndian.PutUint32(buf[n:], t)
		n += 4
	}
	_, _ = d.Write(buf[:n])
	return Hash(d.Sum64())
}

// AppendHashes appends to dst the chained hashes of the full blocks of
// tokens, blockTokens tokens each, starting from prev (a namespace seed, or
// the hash of the block before tokens[0]). It panics if blockTokens < 1.
func AppendHashes(dst []Hash, prev uint64, tokens []uint32, blockTokens int) []Hash {
	if blockTokens < 1 {
		panic("index: blockTokens < 1")
	}
	for len(tokens) >= blockTokens {
		h := ChainHash(prev, tokens[:blockTokens])
		dst = append(dst, h)
		prev = uint64(h)
		tokens = tokens[blockTokens:]
	}
	return dst
}

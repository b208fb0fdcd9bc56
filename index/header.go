package index

import "github.com/cespare/xxhash/v2"

// Header describes one block: its key, what the directory keeps about it
// (Meta: parent, size) and the checksum of its bytes. Tiers store it with a
// block, the data plane sends it ahead of a block's bytes, and the client
// hands it to both.
type Header struct {
	Key Key
	Meta
	// Sum is Checksum of the block's bytes. It is computed once, where the
	// bytes enter the system, and checked wherever they could have been
	// damaged (on the wire, on a disk, in an object store).
	Sum uint64
}

// Checksum is THE block checksum rule: xxhash64 of the block's bytes. Every
// place that computes or checks a block's Sum (client, data plane, tiers,
// kvctl, the RESP server) calls it, so the rule is written once.
func Checksum(b []byte) uint64 { return xxhash.Sum64(b) }

// Digest computes Checksum over bytes that arrive in pieces (from a socket,
// or a value written after its own header): Write them in order, then Sum64
// equals Checksum of their concatenation. The zero value is ready after
// Reset; NewDigest returns one ready to use.
type Digest = xxhash.Digest

// NewDigest returns a Digest ready for the first piece.
func NewDigest() *Digest { return xxhash.New() }

// sumPiece is how much CopySum copies before it hashes: small enough that
// the piece, in both places, is still in the CPU's first-level cache.
const sumPiece = 16 << 10

// CopySum copies src into dst, as copy does, and writes the bytes copied to
// d in the same pass: each piece is hashed right after it is copied, while
// it is still in cache, so the bytes are read from memory once, not twice
// (once to hash, once to copy). It returns the number of bytes copied.
func CopySum(d *Digest, dst, src []byte) int {
	n := min(len(dst), len(src))
	for off := 0; off < n; off += sumPiece {
		end := min(off+sumPiece, n)
		copy(dst[off:end], src[off:end])
		_, _ = d.Write(dst[off:end])
	}
	return n
}

package respnode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// chunkNamespace holds the chunks of values over one block. Its blocks
// are not keys: DBSIZE and SCAN count only index.RESPNamespace (and
// chunkSpace gives each tenant's keyspace its own).
var chunkNamespace = index.NamespaceID(xxhash.Sum64String("kvstrata-resp-chunks-v1"))

// errChunkLost is a chunk a manifest names that no tier holds, or holds
// with other bytes: the value reads as a miss, never short or wrong.
var errChunkLost = errors.New("respnode: chunk lost")

// chunkKey names chunk i of the write gen of the value at k. Each write
// of a chunked value draws a fresh gen, so its chunks never overwrite
// those of the value it replaces, which stays readable until its record
// is replaced.
func chunkKey(k index.Key, gen uint64, i int) index.Key {
	var b [20]byte
	binary.LittleEndian.PutUint64(b[:], uint64(k.Hash))
	binary.LittleEndian.PutUint64(b[8:], gen)
	binary.LittleEndian.PutUint32(b[16:], uint32(i))
	return index.Key{NS: chunkSpace(k.NS), Hash: index.Hash(xxhash.Sum64(b[:]))}
}

// chunkSpace is the namespace of the chunks of the values whose records
// are in ns: chunkNamespace for index.RESPNamespace's; for a tenant's
// (index.BindTenant), one with the same tenant tag in its top 16 bits, so
// that a tenant's chunks count as its blocks.
func chunkSpace(ns index.NamespaceID) index.NamespaceID {
	if ns == index.RESPNamespace {
		return chunkNamespace
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(ns))
	low := xxhash.Sum64(append([]byte("kvstrata-resp-chunks-v1\x00"), b[:]...)) & (1<<48 - 1)
	return index.NamespaceID(uint64(ns.Tenant())<<48 | low)
}

// writeChunks stores value as chunks of chunkSize under a fresh
// generation and returns their manifest. Each chunk is committed as it is
// written (a tier smaller than the value demotes the first ones while the
// last are written); none is reachable until a record names them. On
// failure it deletes the chunks it wrote.
func (s *Store) writeChunks(k index.Key, value []byte, chunkSize int64) (manifest, error) {
	m := manifest{size: int64(len(value)), gen: rand.Uint64(), chunkSize: chunkSize}
	m.sums = make([]uint64, 0, chunks(m.size, chunkSize))
	for off := int64(0); off < m.size; off += chunkSize {
		part := value[off:min(off+chunkSize, m.size)]
		i := len(m.sums)
		h := index.Header{Key: chunkKey(k, m.gen, i)}
		h.Size = uint32(len(part))
		sum, err := s.putBlock(h, part)
		if err != nil {
			s.dropChunks(k, m.gen, i)
			return manifest{}, err
		}
		m.sums = append(m.sums, sum)
	}
	// Writing the last chunks may have evicted the first ones from a node
	// with no tier below to demote them to: the value does not fit.
	for i := range m.sums {
		if _, _, err := s.h.Stat(chunkKey(k, m.gen, i)); err != nil {
			s.dropChunks(k, m.gen, len(m.sums))
			return manifest{}, resp.Mark(fmt.Errorf("value of %s does not fit in the node's tiers: its first parts were evicted while the last were written",
				units.FormatBytes(m.size)), resp.ErrFull)
		}
	}
	return m, nil
}

// putBlock reserves room for block h (whose Sum it computes) in the
// fastest tier, copies part into it, hashing it in the same pass, and
// commits it. It returns the block's checksum.
func (s *Store) putBlock(h index.Header, part []byte) (uint64, error) {
	r, err := s.n.Reserve(h)
	if err != nil {
		return 0, respError(err)
	}
	sum := fill(r.Bytes(), nil, part)
	r.SetSum(sum)
	return sum, respError(r.Commit())
}

// readChunks reads the value m describes into one buffer, checking each
// chunk's length and checksum; a chunk missing or different is
// errChunkLost.
func (s *Store) readChunks(k index.Key, m manifest) ([]byte, error) {
	out := make([]byte, 0, m.size)
	for i, sum := range m.sums {
		want := min(m.chunkSize, m.size-int64(len(out)))
		start := len(out)
		var err error
		out, _, _, err = s.n.Get(chunkKey(k, m.gen, i), out)
		switch {
		case errors.Is(err, tiers.ErrNotFound):
			return nil, fmt.Errorf("chunk %d of %d: %w", i, len(m.sums), errChunkLost)
		case err != nil:
			return nil, respError(err)
		case int64(len(out)-start) != want || index.Checksum(out[start:]) != sum:
			return nil, fmt.Errorf("chunk %d of %d: %d bytes, want %d with checksum %016x: %w", i, len(m.sums), len(out)-start, want, sum, errChunkLost)
		}
	}
	return out, nil
}

// dropChunks deletes the first n chunks of generation gen of k's value,
// those still held.
func (s *Store) dropChunks(k index.Key, gen uint64, n int) {
	for i := range n {
		_ = s.h.Delete(chunkKey(k, gen, i))
	}
}

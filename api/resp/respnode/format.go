package respnode

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The block at index.RESPKey(k) holds one record: k, its deadline, and
// either its value (inline) or, for a value over one block, a manifest of
// the chunk blocks that hold it, in order.
//
//	v2 record:  u32 magic | u8 kind | 3 bytes zero | u32 len(k) | i64 deadline | k | body
//	  inline:   body = the value
//	  manifest: body = u64 size | u64 generation | u32 chunk size | u32 chunks | chunks × u64 checksum
//	v1 record:  u32 len(k) | k | value   (written before deadlines; read as inline, no deadline)
//
// Integers are little-endian; the deadline is Unix nanoseconds, 0 for
// none. A v1 record's first word is a key length, under 2^31; the magic
// has its top bit set, so the two never read as each other.
const (
	recordMagic  = 0xCB5A7E02
	recordHeader = 20 // magic, kind and padding, key length, deadline
	manifestHead = 24 // size, generation, chunk size, chunks
	v1Header     = 4

	// maxValue bounds the size a manifest may claim (1 TiB), far above
	// any limit, so that no arithmetic on it overflows.
	maxValue = 1 << 40

	kindInline   = 1
	kindManifest = 2
)

// errBadRecord marks a block that is not a record this package wrote (or
// that was damaged): it reads as a miss.
var errBadRecord = errors.New("respnode: malformed record")

// record is one decoded value block. Its slices point into the block.
type record struct {
	key      []byte
	deadline int64 // Unix nanoseconds; 0: none
	kind     byte
	value    []byte   // inline
	manifest manifest // kindManifest
}

// manifest lists the chunks of a value kept as several blocks.
type manifest struct {
	size      int64  // the value's length
	gen       uint64 // names this write's chunks (chunkKey)
	chunkSize int64
	sums      []uint64 // index.Checksum of each chunk, in order
}

// chunks is how many chunks of chunkSize hold size bytes.
func chunks(size, chunkSize int64) int64 { return (size + chunkSize - 1) / chunkSize }

// inlineLen and manifestLen are the lengths of the records encode writes.
func inlineLen(key string, value int) int { return recordHeader + len(key) + value }
func manifestLen(key string, n int64) int64 {
	return recordHeader + int64(len(key)) + manifestHead + 8*n
}

// putHeader writes the fixed part of a record and the key into b.
func putHeader(b []byte, kind byte, key string, deadline int64) []byte {
	binary.LittleEndian.PutUint32(b, recordMagic)
	b[4], b[5], b[6], b[7] = kind, 0, 0, 0
	binary.LittleEndian.PutUint32(b[8:], uint32(len(key)))
	binary.LittleEndian.PutUint64(b[12:], uint64(deadline))
	copy(b[recordHeader:], key)
	return b[recordHeader+len(key):]
}

// encodeInline writes an inline record into b, of inlineLen bytes.
func encodeInline(b []byte, key string, deadline int64, value []byte) {
	copy(putHeader(b, kindInline, key, deadline), value)
}

// encodeManifest returns a manifest record.
func encodeManifest(key string, deadline int64, m manifest) []byte {
	b := make([]byte, manifestLen(key, int64(len(m.sums))))
	body := putHeader(b, kindManifest, key, deadline)
	binary.LittleEndian.PutUint64(body, uint64(m.size))
	binary.LittleEndian.PutUint64(body[8:], m.gen)
	binary.LittleEndian.PutUint32(body[16:], uint32(m.chunkSize))
	binary.LittleEndian.PutUint32(body[20:], uint32(len(m.sums)))
	for i, s := range m.sums {
		binary.LittleEndian.PutUint64(body[manifestHead+8*i:], s)
	}
	return b
}

// decode reads a record, checking every length against the block's: a
// block it cannot read whole is errBadRecord, never a short value.
func decode(b []byte) (record, error) {
	if len(b) < 4 {
		return record{}, fmt.Errorf("%w: %d bytes", errBadRecord, len(b))
	}
	first := binary.LittleEndian.Uint32(b)
	if first>>31 == 0 { // v1: a key length
		if int64(first) > int64(len(b)-v1Header) {
			return record{}, fmt.Errorf("%w: v1 key of %d bytes in a block of %d", errBadRecord, first, len(b))
		}
		return record{key: b[v1Header : v1Header+first], kind: kindInline, value: b[v1Header+first:]}, nil
	}
	if first != recordMagic || len(b) < recordHeader || b[5]|b[6]|b[7] != 0 {
		return record{}, fmt.Errorf("%w: unknown magic %08x", errBadRecord, first)
	}
	r := record{kind: b[4], deadline: int64(binary.LittleEndian.Uint64(b[12:]))}
	kl := int64(binary.LittleEndian.Uint32(b[8:]))
	if kl > int64(len(b)-recordHeader) || r.deadline < 0 {
		return record{}, fmt.Errorf("%w: key of %d bytes in a block of %d", errBadRecord, kl, len(b))
	}
	r.key, b = b[recordHeader:recordHeader+kl], b[recordHeader+kl:]
	switch r.kind {
	case kindInline:
		r.value = b
		return r, nil
	case kindManifest:
		if len(b) < manifestHead {
			return record{}, fmt.Errorf("%w: manifest of %d bytes", errBadRecord, len(b))
		}
		m := manifest{size: int64(binary.LittleEndian.Uint64(b)), gen: binary.LittleEndian.Uint64(b[8:]),
			chunkSize: int64(binary.LittleEndian.Uint32(b[16:]))}
		n := int64(binary.LittleEndian.Uint32(b[20:]))
		if m.size <= 0 || m.size > maxValue || m.chunkSize <= 0 || chunks(m.size, m.chunkSize) != n || int64(len(b)-manifestHead) != 8*n {
			return record{}, fmt.Errorf("%w: manifest of %d bytes in %d chunks of %d, %d bytes of checksums",
				errBadRecord, m.size, n, m.chunkSize, len(b)-manifestHead)
		}
		m.sums = make([]uint64, n)
		for i := range m.sums {
			m.sums[i] = binary.LittleEndian.Uint64(b[manifestHead+8*i:])
		}
		r.manifest = m
		return r, nil
	}
	return record{}, fmt.Errorf("%w: unknown kind %d", errBadRecord, r.kind)
}

// size is the length of the value the record holds.
func (r *record) size() int64 {
	if r.kind == kindManifest {
		return r.manifest.size
	}
	return int64(len(r.value))
}

package s3

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// A segment's index object, big-endian throughout:
//
//	header, indexHeaderSize bytes
//	offset size field
//	0      4    magic "KVS3"
//	4      2    version, indexVersion
//	6      2    reserved, zero
//	8      16   segment id: seal time (Unix ns), writer
//	24     8    data object size in bytes
//	32     4    entry count n
//	36     4    reserved, zero
//
//	n entries, indexEntrySize bytes each, in offset order
//	0      8    key namespace
//	8      8    key hash
//	16     8    parent hash; zero without a parent
//	24     8    offset of the block's bytes in the data object
//	32     4    block size in bytes
//	36     1    flags: bit 0 set when the block has a parent; others zero
//	37     3    reserved, zero
//	40     8    block checksum, index.Header.Sum (xxhash64 of the bytes)
//
//	trailer, 8 bytes: xxhash64 of everything before it
//
// The index repeats its segment's id so that an index read under the wrong
// name is caught. Blocks do not overlap and keys are unique; gaps are the
// bytes of blocks deleted after the data object was written. The encoding
// is canonical: decodeIndex accepts exactly what encodeIndex writes.
const (
	indexMagic      = "KVS3"
	indexVersion    = 1
	indexHeaderSize = 40
	indexEntrySize  = 48
	indexTrailSize  = 8

	entryFlagHasParent = 1 << 0

	// maxDataSize bounds the data object size an index may claim.
	maxDataSize = 1 << 42
)

// indexEntry is one block of a segment.
type indexEntry struct {
	Meta   index.Header
	Offset int64
}

// segIndex is the decoded index of one segment.
type segIndex struct {
	ID       segID
	DataSize int64
	Entries  []indexEntry
}

// indexSize is the encoded size of an index of n entries.
func indexSize(n int) int64 {
	return indexHeaderSize + int64(n)*indexEntrySize + indexTrailSize
}

// encodeIndex appends x's encoding to dst. x must be valid: entries in
// offset order, not overlapping, inside DataSize, with unique keys.
func encodeIndex(dst []byte, x *segIndex) []byte {
	start := len(dst)
	var h [indexHeaderSize]byte
	copy(h[0:4], indexMagic)
	binary.BigEndian.PutUint16(h[4:6], indexVersion)
	x.ID.putBinary(h[8:24])
	binary.BigEndian.PutUint64(h[24:32], uint64(x.DataSize))
	binary.BigEndian.PutUint32(h[32:36], uint32(len(x.Entries)))
	dst = append(dst, h[:]...)
	for _, e := range x.Entries {
		var b [indexEntrySize]byte
		m := e.Meta
		binary.BigEndian.PutUint64(b[0:8], uint64(m.Key.NS))
		binary.BigEndian.PutUint64(b[8:16], uint64(m.Key.Hash))
		if m.HasParent {
			binary.BigEndian.PutUint64(b[16:24], uint64(m.Parent))
			b[36] = entryFlagHasParent
		}
		binary.BigEndian.PutUint64(b[24:32], uint64(e.Offset))
		binary.BigEndian.PutUint32(b[32:36], m.Size)
		binary.BigEndian.PutUint64(b[40:48], m.Sum)
		dst = append(dst, b[:]...)
	}
	return binary.BigEndian.AppendUint64(dst, xxhash.Sum64(dst[start:]))
}

// decodeIndex decodes an index object. Every malformed index fails with
// an error that wraps tiers.ErrCorrupt.
func decodeIndex(b []byte) (*segIndex, error) {
	if len(b) < indexHeaderSize+indexTrailSize {
		return nil, corruptf("index is %d bytes, shorter than its header and trailer", len(b))
	}
	body := b[:len(b)-indexTrailSize]
	if got, want := binary.BigEndian.Uint64(b[len(body):]), xxhash.Sum64(body); got != want {
		return nil, corruptf("index checksum %016x, want %016x", got, want)
	}
	if string(b[0:4]) != indexMagic {
		return nil, corruptf("index magic %q, want %q", b[0:4], indexMagic)
	}
	if v := binary.BigEndian.Uint16(b[4:6]); v != indexVersion {
		return nil, corruptf("index version %d, want %d", v, indexVersion)
	}
	if binary.BigEndian.Uint16(b[6:8]) != 0 || binary.BigEndian.Uint32(b[36:40]) != 0 {
		return nil, corruptf("index header has non-zero reserved bytes")
	}
	x := &segIndex{ID: segIDFrom(b[8:24])}
	size := binary.BigEndian.Uint64(b[24:32])
	if size > maxDataSize {
		return nil, corruptf("index claims a %d-byte data object, over the %d limit", size, uint64(maxDataSize))
	}
	x.DataSize = int64(size)
	n := binary.BigEndian.Uint32(b[32:36])
	if want := indexSize(int(n)); int64(len(b)) != want {
		return nil, corruptf("index of %d entries is %d bytes, want %d", n, len(b), want)
	}
	x.Entries = make([]indexEntry, n)
	seen := make(map[index.Key]struct{}, n)
	var end int64 // end of the previous block
	for i := range x.Entries {
		e, err := decodeEntry(b[indexHeaderSize+i*indexEntrySize:][:indexEntrySize])
		if err != nil {
			return nil, fmt.Errorf("index entry %d: %w", i, err)
		}
		if e.Offset < end || e.Offset+int64(e.Meta.Size) > x.DataSize {
			return nil, corruptf("index entry %d: bytes [%d, %d) overlap the previous block (ending at %d) or pass the data size %d",
				i, e.Offset, e.Offset+int64(e.Meta.Size), end, x.DataSize)
		}
		if _, dup := seen[e.Meta.Key]; dup {
			return nil, corruptf("index entry %d: key %v is listed twice", i, e.Meta.Key)
		}
		seen[e.Meta.Key] = struct{}{}
		end = e.Offset + int64(e.Meta.Size)
		x.Entries[i] = e
	}
	return x, nil
}

func decodeEntry(b []byte) (indexEntry, error) {
	var e indexEntry
	m := &e.Meta
	m.Key.NS = index.NamespaceID(binary.BigEndian.Uint64(b[0:8]))
	m.Key.Hash = index.Hash(binary.BigEndian.Uint64(b[8:16]))
	m.Parent = index.Hash(binary.BigEndian.Uint64(b[16:24]))
	off := binary.BigEndian.Uint64(b[24:32])
	m.Size = binary.BigEndian.Uint32(b[32:36])
	flags := b[36]
	m.Sum = binary.BigEndian.Uint64(b[40:48])
	switch {
	case flags&^entryFlagHasParent != 0:
		return e, corruptf("unknown flags %#02x", flags)
	case b[37] != 0 || b[38] != 0 || b[39] != 0:
		return e, corruptf("non-zero reserved bytes")
	case flags&entryFlagHasParent == 0 && m.Parent != 0:
		return e, corruptf("a parent hash without the parent flag")
	case off > maxDataSize:
		return e, corruptf("offset %d over the %d limit", off, uint64(maxDataSize))
	}
	m.HasParent = flags&entryFlagHasParent != 0
	e.Offset = int64(off)
	return e, nil
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", tiers.ErrCorrupt, fmt.Sprintf(format, args...))
}

package ssd

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Key space. Every Pebble key starts with one prefix byte; block keys then
// hold the namespace and the hash, both big-endian, so that a namespace's
// blocks sort together.
const (
	prefixFormat  byte = 0x00 // the format marker: one key, formatKey
	prefixRecord  byte = 'm'  // metadata records, recordSize bytes each
	prefixPayload byte = 'p'  // inline block bytes, exactly as put

	keySize = 1 + 8 + 8
)

// formatKey holds formatVersion; Open refuses a store without it that is
// not empty, and one with a version it does not know. Format 1 had no
// block files: Open takes such a store over as it is (its records read as
// inline blocks) and marks it format 2, which older builds refuse.
var (
	formatKey      = []byte("\x00kvstrata/ssd")
	formatVersion  = []byte("2")
	formatVersion1 = []byte("1")
)

// dbKey is a block's Pebble key under one prefix.
type dbKey [keySize]byte

func makeKey(prefix byte, k index.Key) dbKey {
	var b dbKey
	b[0] = prefix
	binary.BigEndian.PutUint64(b[1:9], uint64(k.NS))
	binary.BigEndian.PutUint64(b[9:17], uint64(k.Hash))
	return b
}

// parseKey is the inverse of makeKey for a key under prefix.
func parseKey(prefix byte, b []byte) (index.Key, error) {
	if len(b) != keySize || b[0] != prefix {
		return index.Key{}, fmt.Errorf("%w: key %x is not a %q key", tiers.ErrCorrupt, b, prefix)
	}
	return index.Key{
		NS:   index.NamespaceID(binary.BigEndian.Uint64(b[1:9])),
		Hash: index.Hash(binary.BigEndian.Uint64(b[9:17])),
	}, nil
}

// prefixBounds returns the [lower, upper) key range of prefix.
func prefixBounds(prefix byte) (lower, upper []byte) {
	return []byte{prefix}, []byte{prefix + 1}
}

// The metadata record, recordSize bytes, big-endian:
//
//	offset size field
//	0      1    version, recordVersion
//	1      1    flags: bit 0 set when the block has a parent, bit 1 when
//	            its bytes are in a block file; others zero
//	2      4    block size in bytes
//	6      8    key namespace
//	14     8    key hash
//	22     8    parent hash; zero without a parent
//	30     8    block checksum, index.Header.Sum (xxhash64 of the bytes)
//	38     8    number of the block file (blockfile.go); zero when the
//	            bytes are inline, in the payload key
//	46     4    record checksum: low 32 bits of xxhash64 of bytes 0–45
//
// The record repeats its key so that a record read under the wrong key is
// caught, and checks itself so that a damaged record is never trusted.
// Records of version 1 (format 1 stores, before block files) are 42 bytes:
// the same without the file number, the checksum at 38; they are read as
// inline blocks.
const (
	recordVersion   = 2
	recordSize      = 50
	recordVersion1  = 1
	recordSizeV1    = 42
	flagHasParent   = 1 << 0
	flagInFile      = 1 << 1
	knownFlags      = flagHasParent | flagInFile
	recordSumOffset = recordSize - 4
)

// RecordOverhead is the fixed cost in bytes that the tier counts for each
// block on top of its size: the metadata record and both keys, Pebble's
// per-key trailers and the blob-file reference, rounded up.
const RecordOverhead = 128

// encodeRecord appends m's metadata record to dst; gen is the number of
// the block's file, zero for a block kept inline.
func encodeRecord(dst []byte, m index.Header, gen uint64) []byte {
	var b [recordSize]byte
	b[0] = recordVersion
	if m.HasParent {
		b[1] = flagHasParent
	}
	if gen != 0 {
		b[1] |= flagInFile
	}
	binary.BigEndian.PutUint32(b[2:6], m.Size)
	binary.BigEndian.PutUint64(b[6:14], uint64(m.Key.NS))
	binary.BigEndian.PutUint64(b[14:22], uint64(m.Key.Hash))
	if m.HasParent {
		binary.BigEndian.PutUint64(b[22:30], uint64(m.Parent))
	}
	binary.BigEndian.PutUint64(b[30:38], m.Sum)
	binary.BigEndian.PutUint64(b[38:46], gen)
	binary.BigEndian.PutUint32(b[46:50], uint32(xxhash.Sum64(b[:46])))
	return append(dst, b[:]...)
}

// decodeRecord decodes a metadata record and returns the number of the
// block's file (zero for a block kept inline). Every malformed record
// fails with an error that wraps tiers.ErrCorrupt.
func decodeRecord(b []byte) (index.Header, uint64, error) {
	var sumAt int
	switch {
	case len(b) == recordSize && b[0] == recordVersion:
		sumAt = recordSumOffset
	case len(b) == recordSizeV1 && b[0] == recordVersion1:
		sumAt = recordSizeV1 - 4
	case len(b) != recordSize && len(b) != recordSizeV1:
		return index.Header{}, 0, fmt.Errorf("%w: record is %d bytes, want %d", tiers.ErrCorrupt, len(b), recordSize)
	default:
		return index.Header{}, 0, fmt.Errorf("%w: record of %d bytes has version %d", tiers.ErrCorrupt, len(b), b[0])
	}
	if got, want := binary.BigEndian.Uint32(b[sumAt:sumAt+4]), uint32(xxhash.Sum64(b[:sumAt])); got != want {
		return index.Header{}, 0, fmt.Errorf("%w: record checksum %08x, want %08x", tiers.ErrCorrupt, got, want)
	}
	flags := b[1]
	if flags&^knownFlags != 0 || b[0] == recordVersion1 && flags&flagInFile != 0 {
		return index.Header{}, 0, fmt.Errorf("%w: unknown record flags %#02x", tiers.ErrCorrupt, flags)
	}
	var m index.Header
	m.HasParent = flags&flagHasParent != 0
	m.Size = binary.BigEndian.Uint32(b[2:6])
	m.Key.NS = index.NamespaceID(binary.BigEndian.Uint64(b[6:14]))
	m.Key.Hash = index.Hash(binary.BigEndian.Uint64(b[14:22]))
	m.Parent = index.Hash(binary.BigEndian.Uint64(b[22:30]))
	m.Sum = binary.BigEndian.Uint64(b[30:38])
	if !m.HasParent && m.Parent != 0 {
		return index.Header{}, 0, fmt.Errorf("%w: record has a parent hash but no parent flag", tiers.ErrCorrupt)
	}
	var gen uint64
	if b[0] == recordVersion {
		gen = binary.BigEndian.Uint64(b[38:46])
	}
	if (gen != 0) != (flags&flagInFile != 0) {
		return index.Header{}, 0, fmt.Errorf("%w: record's file flag and file number %d disagree", tiers.ErrCorrupt, gen)
	}
	return m, gen, nil
}

// decodeRecordFor decodes the record stored under key and checks that it
// names key.
func decodeRecordFor(key index.Key, b []byte) (index.Header, uint64, error) {
	m, gen, err := decodeRecord(b)
	if err != nil {
		return index.Header{}, 0, err
	}
	if m.Key != key {
		return index.Header{}, 0, fmt.Errorf("%w: record stored under %v names %v", tiers.ErrCorrupt, key, m.Key)
	}
	return m, gen, nil
}

// cost is what a block counts against Capacity.
func cost(size uint32) int64 { return int64(size) + RecordOverhead }

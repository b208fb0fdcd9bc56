package ssd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

func sampleMeta() index.Header {
	m := index.Header{Key: index.Key{NS: 0x0102030405060708, Hash: 0x1112131415161718}, Sum: 0x2122232425262728}
	m.Parent, m.HasParent, m.Size = 0x3132333435363738, true, 1<<20
	return m
}

func TestRecordRoundTrip(t *testing.T) {
	root := sampleMeta()
	root.Parent, root.HasParent = 0, false
	edge := index.Header{Key: index.Key{NS: math.MaxUint64, Hash: math.MaxUint64}, Sum: math.MaxUint64}
	edge.Parent, edge.HasParent, edge.Size = math.MaxUint64, true, math.MaxUint32
	for _, m := range []index.Header{sampleMeta(), root, edge, {}} {
		for _, gen := range []uint64{0, 1, math.MaxUint64} {
			b := encodeRecord([]byte("prefix"), m, gen)
			if !bytes.HasPrefix(b, []byte("prefix")) || len(b) != len("prefix")+recordSize {
				t.Fatalf("encodeRecord did not append %d bytes: %x", recordSize, b)
			}
			got, ggen, err := decodeRecord(b[len("prefix"):])
			if err != nil {
				t.Fatalf("decode %+v: %v", m, err)
			}
			if got != m || ggen != gen {
				t.Fatalf("decoded %+v in file %d, want %+v in %d", got, ggen, m, gen)
			}
		}
		got, gen, err := decodeRecord(encodeRecordV1(nil, m))
		if err != nil || got != m || gen != 0 {
			t.Fatalf("version 1 record of %+v decoded as %+v in file %d, %v", m, got, gen, err)
		}
	}
}

// encodeRecordV1 is encodeRecord of format 1, before block files.
func encodeRecordV1(dst []byte, m index.Header) []byte {
	b := encodeRecord(nil, m, 0)
	b[0] = recordVersion1
	b = b[:recordSizeV1]
	binary.BigEndian.PutUint32(b[38:42], uint32(xxhash.Sum64(b[:38])))
	return append(dst, b...)
}

// TestRecordLayout pins the on-disk format: a change here breaks stores
// already written.
func TestRecordLayout(t *testing.T) {
	b := encodeRecord(nil, sampleMeta(), 0x4142434445464748)
	want := []byte{
		2, 3, // version, has parent and is in a file
		0x00, 0x10, 0x00, 0x00, // size 1 MiB
		1, 2, 3, 4, 5, 6, 7, 8, // namespace
		0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // hash
		0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, // parent
		0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, // sum
		0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, // file number
	}
	want = binary.BigEndian.AppendUint32(want, uint32(xxhash.Sum64(want)))
	if !bytes.Equal(b, want) {
		t.Fatalf("record\n%x, want\n%x", b, want)
	}
	// Format 1, which Open still reads.
	v1 := []byte{
		1, 1, // version, has parent
		0x00, 0x10, 0x00, 0x00, // size 1 MiB
		1, 2, 3, 4, 5, 6, 7, 8, // namespace
		0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // hash
		0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, // parent
		0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, // sum
	}
	v1 = binary.BigEndian.AppendUint32(v1, uint32(xxhash.Sum64(v1)))
	if m, gen, err := decodeRecord(v1); err != nil || m != sampleMeta() || gen != 0 {
		t.Fatalf("version 1 record: %+v in file %d, %v", m, gen, err)
	}
}

// reseal recomputes a record's checksum after a test edited it, so that
// the decoder's other checks are reached.
func reseal(b []byte) []byte {
	at := len(b) - 4
	binary.BigEndian.PutUint32(b[at:], uint32(xxhash.Sum64(b[:at])))
	return b
}

func TestDecodeRecordRejectsMalformed(t *testing.T) {
	good := encodeRecord(nil, sampleMeta(), 0)
	inFile := encodeRecord(nil, sampleMeta(), 9)
	v1 := encodeRecordV1(nil, sampleMeta())
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	editFile := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), inFile...)) }
	editV1 := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), v1...)) }
	for name, b := range map[string][]byte{
		"Nil":           nil,
		"Empty":         {},
		"OneByte":       {recordVersion},
		"Truncated":     good[:recordSize-1],
		"Extended":      append(append([]byte(nil), good...), 0),
		"FlippedBit":    edit(func(b []byte) []byte { b[20] ^= 4; return b }),
		"BadChecksum":   edit(func(b []byte) []byte { b[49] ^= 1; return b }),
		"ZeroRecord":    make([]byte, recordSize),
		"Version0":      edit(func(b []byte) []byte { b[0] = 0; return reseal(b) }),
		"Version1Long":  edit(func(b []byte) []byte { b[0] = 1; return reseal(b) }),
		"Version2Short": editV1(func(b []byte) []byte { b[0] = 2; return reseal(b) }),
		"Version3":      edit(func(b []byte) []byte { b[0] = 3; return reseal(b) }),
		"V1InFile":      editV1(func(b []byte) []byte { b[1] |= flagInFile; return reseal(b) }),
		"FileNoFlag":    editFile(func(b []byte) []byte { b[1] &^= flagInFile; return reseal(b) }),
		"FlagNoFile":    edit(func(b []byte) []byte { b[1] |= flagInFile; return reseal(b) }),
		"UnknownFlag":   edit(func(b []byte) []byte { b[1] |= 0x80; return reseal(b) }),
		"OrphanParent":  edit(func(b []byte) []byte { b[1] = 0; return reseal(b) }),
		"AllOnes":       bytes.Repeat([]byte{0xff}, recordSize),
		"DoubleRecord":  append(append([]byte(nil), good...), good...),
		"PayloadPrefix": append([]byte{prefixPayload}, good[1:]...),
	} {
		t.Run(name, func(t *testing.T) {
			m, gen, err := decodeRecord(b)
			if !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("decodeRecord(%x) = %+v, %v; want ErrCorrupt", b, m, err)
			}
			if m != (index.Header{}) || gen != 0 {
				t.Fatalf("decodeRecord returned %+v with its error", m)
			}
		})
	}
}

func TestDecodeRecordForChecksTheKey(t *testing.T) {
	m := sampleMeta()
	b := encodeRecord(nil, m, 5)
	if got, gen, err := decodeRecordFor(m.Key, b); err != nil || got != m || gen != 5 {
		t.Fatalf("own key: %+v, %d, %v", got, gen, err)
	}
	other := m.Key
	other.NS++
	if _, _, err := decodeRecordFor(other, b); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("record under another key: %v, want ErrCorrupt", err)
	}
}

func TestKeyRoundTrip(t *testing.T) {
	k := index.Key{NS: 0xa1a2a3a4a5a6a7a8, Hash: 0xb1b2b3b4b5b6b7b8}
	for _, p := range []byte{prefixRecord, prefixPayload} {
		dk := makeKey(p, k)
		if dk[0] != p || !bytes.Equal(dk[1:], []byte{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8,
			0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8}) {
			t.Fatalf("makeKey(%q) = %x", p, dk)
		}
		got, err := parseKey(p, dk[:])
		if err != nil || got != k {
			t.Fatalf("parseKey: %v, %v", got, err)
		}
		lower, upper := prefixBounds(p)
		if bytes.Compare(dk[:], lower) < 0 || bytes.Compare(dk[:], upper) >= 0 {
			t.Fatalf("key %x outside its prefix bounds [%x, %x)", dk, lower, upper)
		}
	}
	rk := makeKey(prefixRecord, k)
	for _, b := range [][]byte{nil, rk[:keySize-1], append(rk[:], 0), formatKey} {
		if _, err := parseKey(prefixRecord, b); !errors.Is(err, tiers.ErrCorrupt) {
			t.Fatalf("parseKey(%x): %v, want ErrCorrupt", b, err)
		}
	}
	if _, err := parseKey(prefixPayload, rk[:]); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("record key parsed as a payload key: %v", err)
	}
	// Namespaces sort before hashes: a namespace's blocks are contiguous.
	a, b := makeKey(prefixRecord, index.Key{NS: 1, Hash: math.MaxUint64}), makeKey(prefixRecord, index.Key{NS: 2})
	if bytes.Compare(a[:], b[:]) >= 0 {
		t.Fatal("keys do not sort by namespace first")
	}
}

// FuzzDecodeRecord checks that decodeRecord never panics, that it either
// accepts a record or rejects it with ErrCorrupt, and that what it accepts
// encodes back to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	good := encodeRecord(nil, sampleMeta(), 0)
	root := sampleMeta()
	root.Parent, root.HasParent = 0, false
	f.Add(good)
	f.Add(encodeRecord(nil, root, 7))
	f.Add(encodeRecord(nil, index.Header{}, 0))
	f.Add(encodeRecordV1(nil, root))
	for _, n := range []int{0, 1, 2, 6, 21, 38, recordSize - 1} {
		f.Add(good[:n])
	}
	f.Add(append(append([]byte(nil), good...), 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, gen, err := decodeRecord(b)
		if err != nil {
			if !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again := encodeRecord(nil, m, gen)
		if len(b) == recordSizeV1 {
			again = encodeRecordV1(nil, m)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted %x, which encodes back as %x", b, again)
		}
	})
}

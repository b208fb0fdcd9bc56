package s3

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// sampleIndex is an index of n blocks with gaps (deleted blocks) between
// some of them, and a zero-byte block.
func sampleIndex(n int) *segIndex {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	x := &segIndex{ID: segID{Time: 1_700_000_000_000_000_000, Writer: r.Uint64()}}
	var off int64
	for i := range n {
		var m index.Header
		m.Key = index.Key{NS: index.NamespaceID(r.Uint64()), Hash: index.Hash(r.Uint64())}
		m.Size = uint32(r.IntN(1 << 20))
		if i == 1 {
			m.Size = 0
		}
		if i%3 != 0 {
			m.Parent, m.HasParent = index.Hash(r.Uint64()), true
		}
		m.Sum = r.Uint64()
		if i%4 == 2 {
			off += int64(r.IntN(4096)) // a deleted block's bytes
		}
		x.Entries = append(x.Entries, indexEntry{Meta: m, Offset: off})
		off += int64(m.Size)
	}
	x.DataSize = off + 17
	return x
}

func TestIndexRoundTrip(t *testing.T) {
	for _, n := range []int{1, 2, 7, 100} {
		x := sampleIndex(n)
		b := encodeIndex([]byte("prefix"), x)[len("prefix"):]
		if int64(len(b)) != indexSize(n) {
			t.Fatalf("%d entries encode to %d bytes, want %d", n, len(b), indexSize(n))
		}
		got, err := decodeIndex(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != x.ID || got.DataSize != x.DataSize || !slices.Equal(got.Entries, x.Entries) {
			t.Fatalf("%d entries: decoded %+v, want %+v", n, got, x)
		}
	}
}

// withTrailer returns b with its trailing checksum recomputed, so that a
// damaged body reaches the decoder's field checks.
func withTrailer(b []byte) []byte {
	if len(b) < indexTrailSize {
		return b
	}
	b = slices.Clone(b)
	body := b[:len(b)-indexTrailSize]
	binary.BigEndian.PutUint64(b[len(body):], xxhash.Sum64(body))
	return b
}

func TestDecodeIndexRefusesDamage(t *testing.T) {
	good := encodeIndex(nil, sampleIndex(4))
	entry := func(i, field int) int { return indexHeaderSize + i*indexEntrySize + field }
	for _, c := range []struct {
		name string
		edit func(b []byte) []byte
	}{
		{"empty", func([]byte) []byte { return nil }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }},
		{"flipped bit, old trailer", func(b []byte) []byte { b[100] ^= 1; return b }},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return withTrailer(b) }},
		{"version", func(b []byte) []byte { b[5] = 2; return withTrailer(b) }},
		{"reserved header", func(b []byte) []byte { b[37] = 1; return withTrailer(b) }},
		{"count", func(b []byte) []byte { b[35]++; return withTrailer(b) }},
		{"unknown flag", func(b []byte) []byte { b[entry(0, 36)] |= 2; return withTrailer(b) }},
		{"reserved entry", func(b []byte) []byte { b[entry(1, 38)] = 1; return withTrailer(b) }},
		{"parent without flag", func(b []byte) []byte { b[entry(0, 23)] = 1; return withTrailer(b) }},
		{"overlap", func(b []byte) []byte {
			copy(b[entry(3, 24):entry(3, 32)], b[entry(2, 24):entry(2, 32)])
			return withTrailer(b)
		}},
		{"past the data", func(b []byte) []byte { b[31] = 0; b[30] = 0; return withTrailer(b) }},
		{"duplicate key", func(b []byte) []byte {
			copy(b[entry(3, 0):entry(3, 16)], b[entry(1, 0):entry(1, 16)])
			return withTrailer(b)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := decodeIndex(c.edit(slices.Clone(good))); !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("decodeIndex: %v, want ErrCorrupt", err)
			}
		})
	}
}

// FuzzDecodeIndex checks that the decoder never panics, and that what it
// accepts encodes back to the same bytes: the format is canonical.
func FuzzDecodeIndex(f *testing.F) {
	for _, n := range []int{1, 3, 9} {
		f.Add(encodeIndex(nil, sampleIndex(n)))
	}
	f.Add([]byte(indexMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, withTrailer(b)} {
			x, err := decodeIndex(in)
			if err != nil {
				if !errors.Is(err, tiers.ErrCorrupt) {
					t.Fatalf("error without ErrCorrupt: %v", err)
				}
				continue
			}
			if out := encodeIndex(nil, x); !bytes.Equal(out, in) {
				t.Fatalf("decoded index re-encodes differently:\n in %x\nout %x", in, out)
			}
		}
	})
}

func TestSegIDsSortByTimeAsNames(t *testing.T) {
	src := newIDSource()
	now := time.Unix(1_700_000_000, 0)
	a := src.next(now)
	b := src.next(now)                   // same instant
	c := src.next(now.Add(-time.Second)) // the clock stepped back
	if !b.newer(a) || !c.newer(b) || a.String() >= b.String() || b.String() >= c.String() {
		t.Fatalf("ids %v, %v, %v are not strictly increasing", a, b, c)
	}
	for _, id := range []segID{a, {Time: 1, Writer: 1 << 63}} {
		got, err := parseSegID(id.String())
		if err != nil || got != id {
			t.Fatalf("parseSegID(%q) = %v, %v", id, got, err)
		}
	}
	for _, bad := range []string{"", "0123", a.String()[:32] + "X", "0000000000000000_0000000000000000",
		"ABCDEF0000000000-0000000000000000"} {
		if _, err := parseSegID(bad); err == nil {
			t.Errorf("parseSegID(%q) accepted it", bad)
		}
	}
	l := newLayout("kv/prod")
	if got, ok := l.parseIndexName(l.indexName(a)); !ok || got != a {
		t.Fatalf("index name %q does not parse back", l.indexName(a))
	}
	if _, ok := l.parseIndexName(l.dataName(a)); ok {
		t.Fatal("a data object's name parsed as an index name")
	}
	if at := l.indexNameAt(now); at >= l.indexName(a) || l.indexName(a) >= l.indexNameAt(now.Add(time.Second)) {
		t.Fatalf("indexNameAt does not bracket %q", l.indexName(a))
	}
}

func TestSegmentReaderReadsTheLayout(t *testing.T) {
	seg := &segment{}
	var want []byte
	for i, n := range []int{5, 0, 1, 300, 7} {
		b := &block{off: int64(len(want)), data: bytes.Repeat([]byte{byte(i + 1)}, n)}
		b.meta.Size = uint32(n)
		seg.layout = append(seg.layout, b)
		want = append(want, b.data...)
	}
	seg.bytes = int64(len(want))
	r := newSegmentReaderLocked(seg)
	if err := iotest.TestReader(r, want); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(io.NewSectionReader(r, 3, 100))
	if err != nil || !bytes.Equal(got, want[3:103]) {
		t.Fatalf("ReadAt of a section: %v", err)
	}
}

package respnode

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func v1Record(key string, value []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(key)))
	return append(append(b, key...), value...)
}

func inlineRecord(key string, deadline int64, value []byte) []byte {
	b := make([]byte, inlineLen(key, len(value)))
	encodeInline(b, key, deadline, value)
	return b
}

func TestRecordsRoundTrip(t *testing.T) {
	m := manifest{size: 10, gen: 7, chunkSize: 4, sums: []uint64{1, 2, 3}}
	for _, tc := range []struct {
		name string
		b    []byte
		want record
	}{
		{"v1", v1Record("key", []byte("value")), record{key: []byte("key"), kind: kindInline, value: []byte("value")}},
		{"inline", inlineRecord("key", 42, []byte("value")), record{key: []byte("key"), deadline: 42, kind: kindInline, value: []byte("value")}},
		{"manifest", encodeManifest("key", 0, m), record{key: []byte("key"), kind: kindManifest, manifest: m}},
	} {
		got, err := decode(tc.b)
		if err != nil || !bytes.Equal(got.key, tc.want.key) || got.deadline != tc.want.deadline || got.kind != tc.want.kind ||
			!bytes.Equal(got.value, tc.want.value) || got.manifest.size != tc.want.manifest.size || got.manifest.gen != tc.want.manifest.gen ||
			len(got.manifest.sums) != len(tc.want.manifest.sums) {
			t.Errorf("%s: decoded %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

// FuzzDecode: no input makes decode panic, and what it accepts is
// consistent — key and value inside the block, a manifest whose chunks
// cover its size exactly — and encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(v1Record("k", []byte("v")))
	f.Add(inlineRecord("key", 1, []byte("value")))
	f.Add(encodeManifest("key", 5, manifest{size: 9, gen: 1, chunkSize: 4, sums: []uint64{1, 2, 3}}))
	f.Add([]byte{0x02, 0x7e, 0x5a, 0xcb, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decode(b)
		if err != nil {
			return
		}
		if r.deadline < 0 || len(r.key)+len(r.value) > len(b) {
			t.Fatalf("accepted a record larger than its block: %+v", r)
		}
		var again []byte
		switch {
		case binary.LittleEndian.Uint32(b)>>31 == 0:
			again = v1Record(string(r.key), r.value)
		case r.kind == kindInline:
			again = inlineRecord(string(r.key), r.deadline, r.value)
		case r.kind == kindManifest:
			m := r.manifest
			if m.size <= 0 || chunks(m.size, m.chunkSize) != int64(len(m.sums)) {
				t.Fatalf("accepted a manifest whose chunks do not cover it: %+v", m)
			}
			again = encodeManifest(string(r.key), r.deadline, m)
		default:
			t.Fatalf("accepted kind %d", r.kind)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %x, encodes back to %x", b, again)
		}
	})
}

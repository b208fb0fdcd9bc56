package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

func sha(s string) Hash {
	h := sha256.Sum256([]byte(s))
	return BytesHash(h[:])
}

// sampleBatches holds every event kind, every optional field both set and
// not, and hashes of every form: small, negative and above 2^63 integers,
// and sha256 byte strings.
func sampleBatches() []*Batch {
	return []*Batch{
		{TS: 1764621000.25, Events: []Event{
			&BlockStored{
				BlockHashes: []Hash{IntHash(-5), IntHash(math.MinInt64), UintHash(math.MaxUint64)},
				TokenIDs:    []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
				BlockSize:   4,
				Medium:      ptr(MediumGPU),
			},
			&BlockRemoved{BlockHashes: []Hash{IntHash(-5)}, Medium: ptr(MediumGPU)},
		}},
		{TS: 1764621001.5, DataParallelRank: ptr[int64](3), Events: []Event{
			&BlockStored{
				BlockHashes:     []Hash{sha("b1"), sha("b2")},
				ParentBlockHash: ptr(sha("b0")),
				TokenIDs:        []int64{200000, 199999, 0, 65536},
				BlockSize:       2,
				LoraID:          ptr[int64](7),
			},
			&BlockStored{
				BlockHashes:     []Hash{UintHash(1 << 40)},
				ParentBlockHash: ptr(IntHash(42)),
				TokenIDs:        []int64{9},
				BlockSize:       1,
			},
			&BlockRemoved{BlockHashes: []Hash{}},
			&AllBlocksCleared{},
		}},
		{TS: 0, DataParallelRank: ptr[int64](0), Events: []Event{}},
	}
}

// describe writes b as text that is equal for equal batches.
func describe(b *Batch) string {
	var s strings.Builder
	opt := func(p *int64) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	optS := func(p *string) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprintf("%q", *p)
	}
	optH := func(p *Hash) string {
		if p == nil {
			return "nil"
		}
		return p.String()
	}
	fmt.Fprintf(&s, "ts=%v rank=%s", b.TS, opt(b.DataParallelRank))
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *BlockStored:
			fmt.Fprintf(&s, " Stored{%v parent=%s tokens=%v size=%d lora=%s medium=%s}",
				ev.BlockHashes, optH(ev.ParentBlockHash), ev.TokenIDs, ev.BlockSize, opt(ev.LoraID), optS(ev.Medium))
		case *BlockRemoved:
			fmt.Fprintf(&s, " Removed{%v medium=%s}", ev.BlockHashes, optS(ev.Medium))
		case *AllBlocksCleared:
			s.WriteString(" Cleared{}")
		default:
			fmt.Fprintf(&s, " %T", ev)
		}
	}
	return s.String()
}

func TestRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		for i, b := range sampleBatches() {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("%v batch %d: %v", enc, i, err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("%v batch %d: %v", enc, i, err)
			}
			if describe(got) != describe(b) {
				t.Errorf("%v batch %d:\n got %s\nwant %s", enc, i, describe(got), describe(b))
			}
		}
	}
}

// TestEncodingBytes pins both encodings to bytes written by hand from the
// msgpack specification, as msgspec writes them.
func TestEncodingBytes(t *testing.T) {
	ts := "cb41da4b7eb2100000" // float64 1764621000.25
	b := &Batch{TS: 1764621000.25, DataParallelRank: ptr[int64](1), Events: []Event{
		&BlockRemoved{BlockHashes: []Hash{IntHash(-1), BytesHash([]byte{0xab})}, Medium: ptr("GPU")},
		&AllBlocksCleared{},
	}}
	str := func(s string) string { return fmt.Sprintf("%02x", 0xa0+len(s)) + hex.EncodeToString([]byte(s)) }
	hashes := "92" + "ff" + "c401ab" // [-1, b"\xab"]
	want := map[Encoding]string{
		TaggedArrays: "93" + ts + "92" +
			"93" + str("BlockRemoved") + hashes + str("GPU") +
			"91" + str("AllBlocksCleared") +
			"01",
		Maps: "93" + ts + "92" +
			"83" + str("type") + str("BlockRemoved") + str("block_hashes") + hashes + str("medium") + str("GPU") +
			"81" + str("type") + str("AllBlocksCleared") +
			"01",
	}
	for enc, w := range want {
		p, err := Encode(b, enc)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(p); got != w {
			t.Errorf("%v:\n got %s\nwant %s", enc, got, w)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, b := range map[string]*Batch{
		"nil event":        {Events: []Event{nil}},
		"nil BlockStored":  {Events: []Event{(*BlockStored)(nil)}},
		"nil BlockRemoved": {Events: []Event{(*BlockRemoved)(nil)}},
	} {
		if _, err := Encode(b, TaggedArrays); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	if _, err := Encode(&Batch{}, Encoding(7)); err == nil {
		t.Error("unknown encoding: encoded")
	}
}

func TestParseEncoding(t *testing.T) {
	for _, enc := range []Encoding{TaggedArrays, Maps} {
		if got, err := ParseEncoding(enc.String()); err != nil || got != enc {
			t.Errorf("ParseEncoding(%q) = %v, %v", enc.String(), got, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Error(`ParseEncoding("json") accepted`)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good, err := Encode(sampleBatches()[1], TaggedArrays)
	if err != nil {
		t.Fatal(err)
	}
	str := func(s string) string { return fmt.Sprintf("%02x", 0xa0+len(s)) + hex.EncodeToString([]byte(s)) }
	for name, h := range map[string]string{
		"empty":                   "",
		"not a batch":             "c3",
		"batch of one element":    "91cb0000000000000000",
		"ts a string":             "92" + str("x") + "90",
		"events not an array":     "9200c0",
		"event a number":          "920091" + "05",
		"empty tagged array":      "920091" + "90",
		"unknown tag":             "920091" + "91" + str("BlockMoved"),
		"tag not a string":        "920091" + "9105",
		"BlockStored too short":   "920091" + "93" + str("BlockStored") + "90c0",
		"BlockRemoved no hashes":  "920091" + "91" + str("BlockRemoved"),
		"hash a string":           "920091" + "92" + str("BlockRemoved") + "91" + str("h"),
		"token id above int64":    "920091" + "95" + str("BlockStored") + "90c0" + "91cfffffffffffffffff" + "04",
		"forged array length":     "9200dd7fffffff",
		"map without type":        "920091" + "81" + str("medium") + "c0",
		"map of unknown type":     "920091" + "81" + str("type") + str("Foo"),
		"map key not a string":    "920091" + "81" + "01c0",
		"map key twice":           "920091" + "82" + str("type") + str("AllBlocksCleared") + str("type") + str("AllBlocksCleared"),
		"map BlockStored partial": "920091" + "82" + str("type") + str("BlockStored") + str("block_hashes") + "90",
		"batch map without ts":    "81" + str("events") + "90",
		"trailing bytes":          hex.EncodeToString(good) + "00",
		"truncated":               hex.EncodeToString(good[:len(good)-3]),
		"rank a string":           "93" + "00" + "90" + str("r"),
	} {
		p, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := Decode(p)
		if !errors.Is(err, ErrMalformed) || b != nil {
			t.Errorf("%s: Decode = %v, %v; want ErrMalformed", name, b, err)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
}

// TestDecodeForgedLength: a byte-string hash that claims 4 GiB in a
// payload of a few bytes is refused without allocating what it claims.
func TestDecodeForgedLength(t *testing.T) {
	str := func(s string) string { return fmt.Sprintf("%02x", 0xa0+len(s)) + hex.EncodeToString([]byte(s)) }
	p, err := hex.DecodeString("920091" + "92" + str("BlockRemoved") + "91" + "c6ffffffff00")
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Decode(p)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode err = %v, want ErrMalformed", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("decoding a %d-byte payload allocated %d bytes", len(p), n)
	}
	t.Log(err)
}

// TestDecodeDeepNesting: an unknown value nested a million levels deep
// is skipped without recursion (with msgpack's recursive Skip, the stack
// limit set here is exceeded and the program dies).
func TestDecodeDeepNesting(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(8 << 20))
	const depth = 1 << 20
	p := append([]byte{0x94, 0x00, 0x90, 0xc0}, bytes.Repeat([]byte{0x91}, depth)...) // [0, [], nil, [[[...
	b, err := Decode(append(p, 0xc0))
	if err != nil || describe(b) != "ts=0 rank=nil" {
		t.Fatalf("Decode = %v, %v", b, err)
	}
	if _, err := Decode(p); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated: Decode err = %v, want ErrMalformed", err)
	}
}

// TestDecodeSkipsWhatItDoesNotKnow: fields newer vLLM adds (lora_name,
// extra_keys, group_idx ...) after the known ones in a tagged array, or
// anywhere in a map, are skipped.
func TestDecodeSkipsWhatItDoesNotKnow(t *testing.T) {
	str := func(s string) string { return fmt.Sprintf("%02x", 0xa0+len(s)) + hex.EncodeToString([]byte(s)) }
	for name, tc := range map[string]struct{ hex, want string }{
		"array extra fields": {
			"92" + "00" + "91" + "99" + str("BlockStored") + "9101" + "c0" + "9102" + "01" + "c0" + str("GPU") + str("lora") + "90",
			`ts=0 rank=nil Stored{[1] parent=nil tokens=[2] size=1 lora=nil medium="GPU"}`},
		"array without medium (older vLLM)": {
			"92" + "00" + "92" + "96" + str("BlockStored") + "9101" + "c0" + "9102" + "01" + "07" + "92" + str("BlockRemoved") + "90",
			`ts=0 rank=nil Stored{[1] parent=nil tokens=[2] size=1 lora=7 medium=nil} Removed{[] medium=nil}`},
		"map batch, tag last, unknown keys": {
			"83" + str("events") + "91" + "84" + str("block_hashes") + "91c403616263" + str("group_idx") + "00" + str("medium") + str("CPU") + str("type") + str("BlockRemoved") +
				str("ts") + "cb3ff8000000000000" + str("data_parallel_rank") + "02",
			`ts=1.5 rank=2 Removed{[0x616263] medium="CPU"}`},
		"array batch with an extra element": {"94" + "00" + "90" + "c0" + "c3", `ts=0 rank=nil`},
	} {
		p, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := Decode(p)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := describe(b); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, tc.want)
		}
	}
}

func TestHash(t *testing.T) {
	if !IntHash(5).Equal(UintHash(5)) || IntHash(-1).Equal(UintHash(math.MaxUint64)) {
		t.Error("integer hashes compare wrong")
	}
	if BytesHash(nil).Equal(IntHash(0)) || !BytesHash(nil).Equal(BytesHash([]byte{})) {
		t.Error("byte hashes compare wrong")
	}
	if v, ok := UintHash(math.MaxUint64).Int64(); ok {
		t.Errorf("2^64-1 as int64 = %d", v)
	}
	if v, ok := IntHash(-3).Uint64(); ok {
		t.Errorf("-3 as uint64 = %d", v)
	}
	if v, ok := IntHash(-3).Int64(); !ok || v != -3 {
		t.Errorf("-3 as int64 = %d, %v", v, ok)
	}
	if !bytes.Equal(sha("x").Bytes(), sha("x").Bytes()) || !sha("x").IsBytes() {
		t.Error("bytes hash")
	}
}

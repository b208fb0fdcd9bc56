package frame

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// The golden bytes below pin the encodings: both backends put them on the
// wire, so a change here is a protocol change.

func TestHeaderEncoding(t *testing.T) {
	h := index.Header{
		Key:  index.Key{NS: 0x0102, Hash: 0x0304},
		Meta: index.Meta{Parent: 0x0506, HasParent: true, Size: 0x0708},
		Sum:  0x090a,
	}
	b := make([]byte, HeaderSize)
	PutHeader(b, &h, StatusFull, 0x0b0c)
	want := "0201000000000000" + "0403000000000000" + "0605000000000000" +
		"0a09000000000000" + "08070000" + "01" + "05" + "0c0b"
	if got := hex.EncodeToString(b); got != want {
		t.Fatalf("header encodes as\n%s, want\n%s", got, want)
	}
	got, st, msgLen, err := DecodeHeader(b)
	if err == nil || !errors.Is(err, ErrProtocol) {
		t.Errorf("a msglen of 0x0b0c decodes with %v, want a protocol violation", err)
	}
	if got != h || st != StatusFull || msgLen != 0x0b0c {
		t.Errorf("decodes as %+v, status %d, msglen %d; want %+v, %d, %d", got, st, msgLen, h, StatusFull, 0x0b0c)
	}
}

func TestHeaderWithoutParentSendsNone(t *testing.T) {
	h := index.Header{Key: index.Key{NS: 1, Hash: 2}, Meta: index.Meta{Parent: 99, Size: 3}, Sum: 4}
	b := make([]byte, HeaderSize)
	PutHeader(b, &h, StatusOK, 0)
	got, st, msgLen, err := DecodeHeader(b)
	if err != nil || st != StatusOK || msgLen != 0 {
		t.Fatalf("decode: status %d, msglen %d, %v", st, msgLen, err)
	}
	h.Parent = 0
	if got != h {
		t.Errorf("decodes as %+v, want %+v (no parent)", got, h)
	}
}

func TestDecodeHeaderRejects(t *testing.T) {
	valid := make([]byte, HeaderSize)
	PutHeader(valid, &index.Header{Key: index.Key{NS: 7, Hash: 8}, Meta: index.Meta{Size: 100}}, StatusOK, 0)
	for _, c := range []struct {
		name   string
		mangle func(b []byte)
		want   string
	}{
		{"unknown flag", func(b []byte) { b[36] = 0x02 }, "unknown flags 0x02"},
		{"parent without flag", func(b []byte) { b[16] = 0x01 }, "parent 0000000000000001 without the has-parent flag"},
		{"unknown status", func(b []byte) { b[37] = byte(numStatus) }, "status 7"},
		{"long msg", func(b []byte) { b[38], b[39] = 0x01, 0x02 }, "message of 513 bytes, over 512"},
	} {
		b := bytes.Clone(valid)
		c.mangle(b)
		h, _, _, err := DecodeHeader(b)
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a protocol violation saying %q", c.name, err, c.want)
		}
		if h.Key != (index.Key{NS: 7, Hash: 8}) || h.Size != 100 {
			t.Errorf("%s: the header's fields were not returned: %+v", c.name, h)
		}
	}
}

func TestKeyEncoding(t *testing.T) {
	k := index.Key{NS: 0x1122334455667788, Hash: 0x99aabbccddeeff00}
	b := make([]byte, KeySize)
	PutKey(b, k)
	if got, want := hex.EncodeToString(b), "8877665544332211"+"00ffeeddccbbaa99"; got != want {
		t.Fatalf("key encodes as %s, want %s", got, want)
	}
	if got := DecodeKey(b); got != k {
		t.Errorf("decodes as %v, want %v", got, k)
	}
}

func TestResultEncoding(t *testing.T) {
	b := make([]byte, ResultSize)
	PutResult(b, StatusCorrupt, 300)
	if got, want := hex.EncodeToString(b), "02002c01"; got != want {
		t.Fatalf("result encodes as %s, want %s", got, want)
	}
	if st, n, err := DecodeResult(b); err != nil || st != StatusCorrupt || n != 300 {
		t.Errorf("decodes as status %d, msglen %d, %v", st, n, err)
	}
	for _, bad := range []string{"07000000", "00010000", "00000102"} {
		b, _ := hex.DecodeString(bad)
		if _, _, err := DecodeResult(b); !errors.Is(err, ErrProtocol) {
			t.Errorf("result %s decodes with %v, want a protocol violation", bad, err)
		}
	}
}

// FuzzDecodeFrames checks that the decoders take any bytes, and that a frame
// they accept encodes back to the same bytes: there is one encoding of each
// frame, so two peers cannot read one frame two ways.
func FuzzDecodeFrames(f *testing.F) {
	seed := make([]byte, HeaderSize)
	PutHeader(seed, &index.Header{Key: index.Key{NS: 1, Hash: 2}, Meta: index.Meta{Parent: 3, HasParent: true, Size: 10}}, StatusOK, 0)
	f.Add(seed)
	PutResult(seed, StatusError, 12)
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		b := make([]byte, HeaderSize)
		copy(b, data)
		key := make([]byte, KeySize)
		PutKey(key, DecodeKey(b))
		canonical(t, "key", b[:KeySize], key)
		if h, st, n, err := DecodeHeader(b); err == nil {
			again := make([]byte, HeaderSize)
			PutHeader(again, &h, st, n)
			canonical(t, "block header", b, again)
		}
		if st, n, err := DecodeResult(b); err == nil {
			again := make([]byte, ResultSize)
			PutResult(again, st, n)
			canonical(t, "result", b[:ResultSize], again)
		}
	})
}

func canonical(t *testing.T, what string, got, again []byte) {
	t.Helper()
	if !bytes.Equal(got, again) {
		t.Fatalf("%s % x decodes and encodes back as % x", what, got, again)
	}
}

func TestCheckPut(t *testing.T) {
	ok := transfer.Block{Header: index.Header{Meta: index.Meta{Size: 3}}, Data: []byte("abc")}
	if err := CheckPut([]transfer.Block{ok, ok}, 2); err != nil {
		t.Errorf("two good blocks: %v", err)
	}
	if err := CheckPut([]transfer.Block{ok, ok, ok}, 2); err == nil || err.Error() != "3 blocks, over the protocol's 2-block limit" {
		t.Errorf("three blocks over a limit of 2: %v", err)
	}
	short := ok
	short.Data = short.Data[:2]
	if err := CheckPut([]transfer.Block{ok, short}, 2); err == nil || !strings.Contains(err.Error(), "block 1 (") ||
		!strings.Contains(err.Error(), "has 2 bytes but its header says 3") {
		t.Errorf("a block shorter than its header: %v", err)
	}
}

func TestCheckGetHeader(t *testing.T) {
	want := index.Key{NS: 1, Hash: 2}
	h := index.Header{Key: want, Meta: index.Meta{Size: 2 << 20}}
	if err := CheckGetHeader(0, want, h, StatusOK, 4<<20); err != nil {
		t.Errorf("a 2 MiB block under a 4 MiB limit: %v", err)
	}
	if err := CheckGetHeader(0, want, h, StatusNotFound, 1<<20); err != nil {
		t.Errorf("a block without bytes is not held to the limit: %v", err)
	}
	err := CheckGetHeader(4, want, h, StatusOK, 1<<20)
	if !errors.Is(err, ErrProtocol) || err.Error() != "protocol violation: block 4 is 2.0 MiB, over this client's 1.0 MiB limit" {
		t.Errorf("a 2 MiB block over a 1 MiB limit: %v", err)
	}
	h.Key.Hash = 3
	if err := CheckGetHeader(4, want, h, StatusNotFound, 4<<20); !errors.Is(err, ErrProtocol) ||
		!strings.Contains(err.Error(), "block 4 is "+h.Key.String()+", want "+want.String()) {
		t.Errorf("a header for another key: %v", err)
	}
}

func TestDecodePutHeaders(t *testing.T) {
	put := func(hs ...index.Header) []byte {
		raw := make([]byte, len(hs)*HeaderSize)
		for i := range hs {
			PutHeader(raw[i*HeaderSize:], &hs[i], StatusOK, 0)
		}
		return raw
	}
	small := index.Header{Key: index.Key{NS: 1, Hash: 1}, Meta: index.Meta{Size: 10}}
	big := index.Header{Key: index.Key{NS: 1, Hash: 2}, Meta: index.Meta{Size: 2 << 20}}
	dst := make([]index.Header, 5)
	hdrs, payload, problem := DecodePutHeaders(dst, put(small, small), 1<<20)
	if problem != "" || payload != 20 || len(hdrs) != 2 || hdrs[1] != small || &hdrs[0] != &dst[0] {
		t.Errorf("two good headers: %d headers, %d bytes, %q; want them in dst", len(hdrs), payload, problem)
	}
	_, payload, problem = DecodePutHeaders(nil, put(small, big), 1<<20)
	if problem != "block 1 is 2.0 MiB, over the 1.0 MiB limit" || payload != 10+2<<20 {
		t.Errorf("an oversized block: %d bytes, %q", payload, problem)
	}
	raw := put(small, small, small, small, small)
	raw[37] = byte(StatusError)   // block 0 carries a status
	raw[HeaderSize+36] = 0x80     // block 1 an unknown flag
	raw[2*HeaderSize+32+3] = 0x01 // block 2 is 16 MiB
	raw[4*HeaderSize+38] = 1      // block 4 a message
	hdrs, _, problem = DecodePutHeaders(nil, raw, 1<<20)
	want := "block 0: a put's header carries status 4 and a 0-byte message, want neither; " +
		"block 1: protocol violation: unknown flags 0x80; block 2 is 16.0 MiB, over the 1.0 MiB limit; and 1 more"
	if problem != want || len(hdrs) != 5 {
		t.Errorf("four bad headers: %d headers, problem\n%q, want\n%q", len(hdrs), problem, want)
	}
}

package kvevents

import (
	"errors"
	"testing"
)

// FuzzDecode: whatever the payload, Decode returns a batch or an error
// wrapping ErrMalformed, never panics; a batch it returns encodes, in
// both encodings, to payloads that decode to the same batch. The seed
// corpus in testdata/fuzz/FuzzDecode holds payloads written by Python's
// msgpack in vLLM's shapes (see python_test.go).
func FuzzDecode(f *testing.F) {
	for _, b := range sampleBatches() {
		for _, enc := range []Encoding{TaggedArrays, Maps} {
			p, err := Encode(b, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || b != nil {
				t.Fatalf("Decode = %v, %v", b, err)
			}
			return
		}
		for _, enc := range []Encoding{TaggedArrays, Maps} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("%v: re-encode: %v", enc, err)
			}
			again, err := Decode(p)
			if err != nil {
				t.Fatalf("%v: decode the re-encoding: %v", enc, err)
			}
			if describe(again) != describe(b) {
				t.Fatalf("%v: %s became %s", enc, describe(b), describe(again))
			}
		}
	})
}

package kvevents

import (
	"context"
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

// FuzzSubscriberMessages: whatever messages a subscriber hears, it never
// panics, and between resets it delivers batches in increasing sequence
// order, accounting for every number up to the last delivered as
// delivered or lost. The input is a run of messages, each a frame count
// (one byte) then frames, each a length (one byte) then its bytes.
func FuzzSubscriberMessages(f *testing.F) {
	frame := func(b []byte) []byte { return append([]byte{byte(len(b))}, b...) }
	small, err := Encode(sampleBatches()[2], TaggedArrays)
	if err != nil {
		f.Fatal(err)
	}
	msg := func(seq int64, payload []byte) []byte {
		out := []byte{3}
		for _, fr := range Frames("", seq, payload) {
			out = append(out, frame(fr)...)
		}
		return out
	}
	var seed []byte
	for _, seq := range []int64{0, 1, 3, 2, 7, 1, 0, 5, -1} {
		seed = append(seed, msg(seq, small)...)
	}
	f.Add(seed)
	f.Add(append(msg(4, []byte{0xc1}), msg(5, small)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		var last int64 = -1
		var delivered, lost int64
		s.cfg.OnReset = func() { last, delivered, lost = -1, 0, 0 }
		s.cfg.OnLost = func(first, end int64) {
			if first != last+1 || end <= first {
				t.Fatalf("lost [%d, %d) after %d", first, end, last)
			}
			lost += end - first
		}
		fn := func(seq int64, b *Batch) {
			if seq <= last || b == nil {
				t.Fatalf("delivered %d after %d", seq, last)
			}
			last = seq
			delivered++
			if delivered+lost != seq+1 {
				t.Fatalf("at %d: %d delivered and %d lost", seq, delivered, lost)
			}
		}
		for len(data) > 0 {
			n := int(data[0] % 5)
			data = data[1:]
			frames := [][]byte{}
			for range n {
				if len(data) == 0 {
					break
				}
				l := min(int(data[0]), len(data)-1)
				frames = append(frames, data[1:1+l])
				data = data[1+l:]
			}
			s.onMessage(context.Background(), frames, fn)
		}
	})
}

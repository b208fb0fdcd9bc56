package raftstore_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/raftstore"
)

const testNS index.NamespaceID = 0x5eed

// chainEvents returns the stored events of a chain of n blocks at loc, the
// way a node reports a prefill: in order, each the parent of the next.
func chainEvents(seed uint64, n int, loc index.Location) []raftstore.Event {
	evs := make([]raftstore.Event, n)
	prev := index.Hash(0)
	for i := range evs {
		h := index.Hash(seed*0x9e3779b97f4a7c15 + uint64(i)*0xbf58476d1ce4e5b9)
		evs[i] = raftstore.Event{
			Kind: raftstore.EventStored,
			Key:  index.Key{NS: testNS, Hash: h},
			Meta: index.Meta{Parent: prev, HasParent: i > 0, Size: 256 << 10},
			Loc:  loc,
		}
		prev = h
	}
	return evs
}

// randomEvents returns n events of every kind, with fields that change
// often enough to exercise every header bit. One event in a hundred drops
// a node, as costly for a directory as it is rare.
func randomEvents(rng *rand.Rand, n int) []raftstore.Event {
	evs := make([]raftstore.Event, n)
	for i := range evs {
		kind := raftstore.EventStored
		switch r := rng.IntN(100); {
		case r == 0:
			kind = raftstore.EventNodeDropped
		case r < 40:
			kind = raftstore.EventRemoved
		}
		ev := raftstore.Event{
			Kind: kind,
			Key:  index.Key{NS: index.NamespaceID(rng.IntN(3)), Hash: index.Hash(rng.Uint64())},
			Meta: index.Meta{HasParent: rng.IntN(2) == 0, Size: uint32(rng.IntN(3)) << uint(rng.IntN(24))},
			Loc:  index.Location{Node: index.NodeID(rng.IntN(3)) << uint(rng.IntN(31)), Tier: index.TierKind(1 + rng.IntN(4))},
		}
		if ev.Meta.HasParent {
			if i > 0 && rng.IntN(2) == 0 {
				ev.Meta.Parent = evs[i-1].Key.Hash
			} else {
				ev.Meta.Parent = index.Hash(rng.Uint64())
			}
		}
		evs[i] = ev
	}
	return evs
}

// sent returns ev as it comes out of a batch: only what its kind sends.
func sent(ev raftstore.Event) raftstore.Event {
	switch ev.Kind {
	case raftstore.EventRemoved:
		ev.Meta = index.Meta{}
	case raftstore.EventNodeDropped:
		ev = raftstore.Event{Kind: ev.Kind, Loc: index.Location{Node: ev.Loc.Node}}
	case raftstore.EventStored:
		if !ev.Meta.HasParent {
			ev.Meta.Parent = 0
		}
	}
	return ev
}

func encode(evs []raftstore.Event) []byte {
	var b raftstore.EventBatch
	for _, ev := range evs {
		b.Append(ev)
	}
	return b.Encode()
}

func TestEventBatchRoundTripsEveryKindAndField(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 20 {
		evs := randomEvents(rng, 1+rng.IntN(2000))
		got, err := raftstore.DecodeEvents(nil, encode(evs))
		if err != nil {
			t.Fatalf("round %d: DecodeEvents: %v", round, err)
		}
		if len(got) != len(evs) {
			t.Fatalf("round %d: decoded %d events, want %d", round, len(got), len(evs))
		}
		for i := range evs {
			if want := sent(evs[i]); got[i] != want {
				t.Fatalf("round %d: event %d = %+v, want %+v", round, i, got[i], want)
			}
		}
	}
}

func TestEventBatchOfAChainTakesNineBytesAnEvent(t *testing.T) {
	evs := chainEvents(1, 1024, index.Location{Node: 3, Tier: index.TierDRAM})
	data := encode(evs)
	// The first event carries the namespace, location and size as well.
	if perEvent := float64(len(data)) / float64(len(evs)); perEvent > 9.05 {
		t.Fatalf("%d bytes for %d events: %.2f bytes an event, want about 9", len(data), len(evs), perEvent)
	}
}

func TestEventBatchResetStartsAFreshBatch(t *testing.T) {
	var b raftstore.EventBatch
	loc := index.Location{Node: 1, Tier: index.TierSSD}
	for _, ev := range chainEvents(1, 10, loc) {
		b.Append(ev)
	}
	b.Reset()
	evs := chainEvents(2, 3, loc)
	for _, ev := range evs {
		b.Append(ev)
	}
	got, err := raftstore.DecodeEvents(nil, b.Encode())
	if err != nil || !slices.Equal(got, evs) || b.Len() != 3 {
		t.Fatalf("after Reset: %v %v, Len %d; want the 3 events appended since", got, err, b.Len())
	}
}

func TestDecodeEventsRejectsDamage(t *testing.T) {
	good := encode(randomEvents(rand.New(rand.NewPCG(5, 6)), 50))
	cases := map[string][]byte{
		"empty":             {},
		"other entry type":  append([]byte{byte(raftstore.EntryLiveness)}, good[1:]...),
		"no count":          {byte(raftstore.EntryEvents)},
		"count beyond data": {byte(raftstore.EntryEvents), 0xff, 0xff, 0x03, 0x01},
		"trailing bytes":    append(slices.Clone(good), 0),
		"reserved bit":      {byte(raftstore.EntryEvents), 1, 0x80 | 0x02, 1, 2, 3, 4, 5, 6, 7, 8},
		"kind 0":            {byte(raftstore.EntryEvents), 1, 0x00, 1, 2, 3, 4, 5, 6, 7, 8},
		"removed with size": {byte(raftstore.EntryEvents), 1, 0x40 | 0x02, 1, 2, 3, 4, 5, 6, 7, 8, 1},
	}
	for i := range len(good) - 1 {
		cases[fmt.Sprintf("truncated to %d bytes", i)] = good[:i]
	}
	for name, data := range cases {
		if _, err := raftstore.DecodeEvents(nil, data); !errors.Is(err, raftstore.ErrBadEntry) {
			t.Errorf("%s: DecodeEvents = %v, want ErrBadEntry", name, err)
		}
	}
}

func FuzzDecodeEvents(f *testing.F) {
	f.Add(encode(randomEvents(rand.New(rand.NewPCG(7, 8)), 20)))
	f.Add(encode(chainEvents(1, 5, index.Location{Node: 1, Tier: index.TierDRAM})))
	f.Fuzz(func(t *testing.T, data []byte) {
		evs, err := raftstore.DecodeEvents(nil, data)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to events that decode the same.
		again, err := raftstore.DecodeEvents(nil, encode(evs))
		if err != nil || !slices.Equal(again, evs) {
			t.Fatalf("re-encoding %v gave %v, %v", evs, again, err)
		}
	})
}

func BenchmarkEventBatchEncode1024(b *testing.B) {
	evs := chainEvents(1, 1024, index.Location{Node: 2, Tier: index.TierDRAM})
	var eb raftstore.EventBatch
	b.ReportAllocs()
	for b.Loop() {
		eb.Reset()
		for _, ev := range evs {
			eb.Append(ev)
		}
		_ = eb.Encode()
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkEventBatchDecode1024(b *testing.B) {
	data := encode(chainEvents(1, 1024, index.Location{Node: 2, Tier: index.TierDRAM}))
	dst := make([]raftstore.Event, 0, 1024)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = raftstore.DecodeEvents(dst[:0], data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1024)/b.Elapsed().Seconds(), "events/s")
}

func randomEventsSeed(seed uint64, n int) []raftstore.Event {
	return randomEvents(rand.New(rand.NewPCG(seed, seed)), n)
}

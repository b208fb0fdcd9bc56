package kvstratav1

import (
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"google.golang.org/protobuf/proto"
)

func TestConvertRoundTrips(t *testing.T) {
	keys := []index.Key{{NS: 1, Hash: 2}, {NS: 1<<64 - 1, Hash: 1<<63 + 5}, {}}
	got := ToKeys(FromKeys(keys))
	for i := range keys {
		if got[i] != keys[i] {
			t.Fatalf("key %d came back as %v, want %v", i, got[i], keys[i])
		}
	}
	h := index.Header{Key: keys[1], Meta: index.Meta{Parent: 9, HasParent: true, Size: 4096}, Sum: 0xdeadbeef}
	m := FromHeader(h)
	if g := ToHeader(m); g != h {
		t.Fatalf("header came back as %+v, want %+v", g, h)
	}
	// Through the wire format too: the fields are the ones the proto names.
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back BlockMeta
	if err := proto.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if g := ToHeader(&back); g != h {
		t.Fatalf("header through the wire came back as %+v, want %+v", g, h)
	}
}

func TestConvertNilIsZero(t *testing.T) {
	if k := ToKey(nil); k != (index.Key{}) {
		t.Fatalf("ToKey(nil) = %v, want the zero key", k)
	}
	if h := ToHeader(nil); h != (index.Header{}) {
		t.Fatalf("ToHeader(nil) = %+v, want the zero header", h)
	}
}

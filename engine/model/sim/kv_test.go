package sim

import (
	"bytes"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

func TestKVBytesAreDeterministicAndVerifiable(t *testing.T) {
	const ns, h = index.NamespaceID(0x1234), index.Hash(0xfeed)
	fill := func(ns index.NamespaceID, h index.Hash, layer, n int) []byte {
		b := make([]byte, n)
		Fill(b, ns, h, layer)
		return b
	}
	a := fill(ns, h, 0, 1024)
	if !bytes.Equal(a, fill(ns, h, 0, 1024)) {
		t.Fatal("two fills of the same block and layer differ")
	}
	if bytes.Count(a, []byte{0}) > 64 {
		t.Errorf("%d of 1024 bytes are zero: not a pseudo-random stream", bytes.Count(a, []byte{0}))
	}
	for what, other := range map[string][]byte{
		"another layer":     fill(ns, h, 1, 1024),
		"another hash":      fill(ns, h+1, 0, 1024),
		"another namespace": fill(ns+1, h, 0, 1024),
	} {
		if bytes.Equal(a, other) {
			t.Errorf("%s gives the same bytes", what)
		}
	}
	if !Verify(ns, h, 0, a) {
		t.Fatal("Verify rejects the bytes Fill wrote")
	}
	for _, i := range []int{0, 7, 8, 511, 1023} {
		b := bytes.Clone(a)
		b[i] ^= 0x01
		if Verify(ns, h, 0, b) {
			t.Errorf("Verify accepts the bytes with byte %d flipped", i)
		}
	}
	if Verify(ns, h, 1, a) || Verify(ns, h+1, 0, a) || Verify(ns+1, h, 0, a) {
		t.Error("Verify accepts one block's bytes as another's")
	}
	// Lengths that are not a multiple of 8 are a prefix of the same stream.
	odd := fill(ns, h, 0, 13)
	if !bytes.Equal(odd, a[:13]) || !Verify(ns, h, 0, odd) {
		t.Error("13 bytes are not the stream's first 13, or do not verify")
	}
	odd[12] ^= 0x80
	if Verify(ns, h, 0, odd) {
		t.Error("Verify accepts a flipped byte in a partial word")
	}
}

func TestVerifyBlock(t *testing.T) {
	const ns, h, layers, n = index.NamespaceID(7), index.Hash(9), 3, 256
	v := make([]byte, layers*n)
	for l := range layers {
		Fill(v[l*n:(l+1)*n], ns, h, l)
	}
	if !VerifyBlock(ns, h, layers, v) {
		t.Fatal("VerifyBlock rejects a block of filled layers")
	}
	if VerifyBlock(ns, h, layers, v[:len(v)-1]) {
		t.Error("VerifyBlock accepts a value that does not split into whole layers")
	}
	v[2*n+5] ^= 0xff
	if VerifyBlock(ns, h, layers, v) {
		t.Error("VerifyBlock accepts a flipped byte in the last layer")
	}
}

func BenchmarkFill(b *testing.B) {
	buf := make([]byte, 16*64)
	b.SetBytes(int64(len(buf)))
	for i := range b.N {
		Fill(buf, 1, index.Hash(i), 0)
	}
}

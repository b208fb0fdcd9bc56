package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/kvstrata/kvstrata/index"
)

// The sim model's KV bytes are a function of the block's name, so that any
// reader — another worker, a test, a replay — can check a block it got from
// kvstrata without the worker that produced it:
//
//	seed  = xxhash64(le64(namespace id) ‖ le64(block hash) ‖ le32(layer))
//	bytes = le64(s1) ‖ le64(s2) ‖ … cut to the layer's length,
//	        s_i = splitmix64 output i of a state starting at seed
//
// splitmix64: state += 0x9e3779b97f4a7c15; z = state;
// z = (z ^ z>>30)·0xbf58476d1ce4e5b9; z = (z ^ z>>27)·0x94d049bb133111eb;
// output z ^ z>>31.

func kvSeed(ns index.NamespaceID, h index.Hash, layer int) uint64 {
	var b [20]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(ns))
	binary.LittleEndian.PutUint64(b[8:], uint64(h))
	binary.LittleEndian.PutUint32(b[16:], uint32(layer))
	return xxhash.Sum64(b[:])
}

func splitmix(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Fill writes into dst the sim KV bytes of layer layer of block h in
// namespace ns; any length of dst is filled.
func Fill(dst []byte, ns index.NamespaceID, h index.Hash, layer int) {
	s := kvSeed(ns, h, layer)
	for len(dst) >= 8 {
		binary.LittleEndian.PutUint64(dst, splitmix(&s))
		dst = dst[8:]
	}
	if len(dst) > 0 {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix(&s))
		copy(dst, tail[:])
	}
}

// Verify reports whether b is exactly the sim KV bytes, of b's length, of
// layer layer of block h in namespace ns. It allocates nothing.
func Verify(ns index.NamespaceID, h index.Hash, layer int, b []byte) bool {
	s := kvSeed(ns, h, layer)
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != splitmix(&s) {
			return false
		}
		b = b[8:]
	}
	if len(b) > 0 {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], splitmix(&s))
		return string(b) == string(tail[:len(b)])
	}
	return true
}

// VerifyBlock reports whether value, a whole block as stored in kvstrata
// (its layers concatenated, layer 0 first), holds the sim KV bytes of
// block h in namespace ns with layers layers.
func VerifyBlock(ns index.NamespaceID, h index.Hash, layers int, value []byte) bool {
	if layers <= 0 || len(value)%layers != 0 {
		return false
	}
	n := len(value) / layers
	for l := range layers {
		if !Verify(ns, h, l, value[l*n:(l+1)*n]) {
			return false
		}
	}
	return true
}

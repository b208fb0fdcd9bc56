package kvstratav1

import "github.com/kvstrata/kvstrata/index"

// The conversions between this package's messages and the index types,
// written once for the server, the client, the cluster service and kvctl.
// Each To function accepts a nil message (reading it as zero), as the
// generated getters do.

// FromKey returns k's message.
func FromKey(k index.Key) *BlockKey {
	return &BlockKey{Namespace: uint64(k.NS), Hash: uint64(k.Hash)}
}

// ToKey returns the key a message names.
func ToKey(k *BlockKey) index.Key {
	return index.Key{NS: index.NamespaceID(k.GetNamespace()), Hash: index.Hash(k.GetHash())}
}

// FromKeys returns the messages of keys, in order.
func FromKeys(keys []index.Key) []*BlockKey {
	out := make([]*BlockKey, len(keys))
	for i, k := range keys {
		out[i] = FromKey(k)
	}
	return out
}

// ToKeys returns the keys that messages name, in order.
func ToKeys(ks []*BlockKey) []index.Key {
	out := make([]index.Key, len(ks))
	for i, k := range ks {
		out[i] = ToKey(k)
	}
	return out
}

// FromHeader returns h's message.
func FromHeader(h index.Header) *BlockMeta {
	return &BlockMeta{Key: FromKey(h.Key), Parent: uint64(h.Parent), HasParent: h.HasParent, Size: h.Size, Checksum: h.Sum}
}

// ToHeader returns the header a message describes.
func ToHeader(m *BlockMeta) index.Header {
	return index.Header{
		Key:  ToKey(m.GetKey()),
		Meta: index.Meta{Parent: index.Hash(m.GetParent()), HasParent: m.GetHasParent(), Size: m.GetSize()},
		Sum:  m.GetChecksum(),
	}
}

package server

import (
	"math"
	"time"

	"github.com/kvstrata/kvstrata/index"

	pb "github.com/kvstrata/kvstrata/api/v1"
)

// The conversions between protobuf messages and the node's types.

func keyFromPB(k *pb.BlockKey) index.Key {
	return index.Key{NS: index.NamespaceID(k.GetNamespace()), Hash: index.Hash(k.GetHash())}
}

func keyToPB(k index.Key) *pb.BlockKey {
	return &pb.BlockKey{Namespace: uint64(k.NS), Hash: uint64(k.Hash)}
}

func keysFromPB(ks []*pb.BlockKey) []index.Key {
	out := make([]index.Key, len(ks))
	for i, k := range ks {
		out[i] = keyFromPB(k)
	}
	return out
}

func metaFromPB(m *pb.BlockMeta) index.Header {
	out := index.Header{Key: keyFromPB(m.GetKey()), Sum: m.GetChecksum()}
	out.Parent, out.HasParent, out.Size = index.Hash(m.GetParent()), m.GetHasParent(), m.GetSize()
	return out
}

func metaToPB(m index.Header) *pb.BlockMeta {
	return &pb.BlockMeta{Key: keyToPB(m.Key), Parent: uint64(m.Parent), HasParent: m.HasParent, Size: m.Size, Checksum: m.Sum}
}

// millis converts a count of milliseconds from a request to a Duration,
// saturating at the longest (about 292 years) or shortest Duration instead
// of wrapping around: 18446744073710 ms is a very long time, not 448 µs.
func millis(ms int64) time.Duration {
	const most = math.MaxInt64 / int64(time.Millisecond)
	switch {
	case ms > most:
		return math.MaxInt64
	case ms < -most:
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}

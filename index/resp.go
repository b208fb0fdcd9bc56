package index

import "github.com/cespare/xxhash/v2"

// RESPNamespace holds the values stored through the Redis protocol: the
// value of key k is block RESPKey(k), {RESPNamespace, xxhash64(k)}. On a
// command line it is named RESPNamespaceName.
var RESPNamespace = NamespaceID(xxhash.Sum64String("kvstrata-resp-v1"))

// RESPNamespaceName is how a person names RESPNamespace where a namespace
// id is asked for (ParseNamespaceID).
const RESPNamespaceName = "redis"

// RESPKey returns the block that holds the Redis-protocol value of key.
func RESPKey(key string) Key {
	return Key{NS: RESPNamespace, Hash: Hash(xxhash.Sum64String(key))}
}

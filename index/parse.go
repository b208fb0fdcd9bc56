package index

import (
	"fmt"
	"strconv"
	"strings"
)

// The text forms of block names, as Hash, NamespaceID and Key print them
// and the CLI reads them: a namespace id and a hash are 16 hex digits each,
// a key is NS/HASH. The errors name what was wrong for a person; they carry
// no package prefix, since the caller says what it was parsing.

// parseHex64 parses 16 hex digits.
func parseHex64(what, s string) (uint64, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("%s %q is not 16 hex digits", what, s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not 16 hex digits", what, s)
	}
	return v, nil
}

// ParseNamespaceID parses a namespace id (16 hex digits), or
// RESPNamespaceName, in any case, for RESPNamespace.
func ParseNamespaceID(s string) (NamespaceID, error) {
	if strings.EqualFold(s, RESPNamespaceName) {
		return RESPNamespace, nil
	}
	v, err := parseHex64("namespace", s)
	if err != nil {
		return 0, fmt.Errorf("%w (or %s for the Redis-protocol values)", err, RESPNamespaceName)
	}
	return NamespaceID(v), nil
}

// ParseHash parses a block hash (16 hex digits).
func ParseHash(s string) (Hash, error) {
	v, err := parseHex64("hash", s)
	return Hash(v), err
}

// ParseKey parses NS/HASH, the form Key.String prints; NS may be
// RESPNamespaceName.
func ParseKey(s string) (Key, error) {
	ns, h, ok := strings.Cut(s, "/")
	if !ok {
		return Key{}, fmt.Errorf("key %q is not NS/HASH (16 hex digits each, as in 00000000000000ab/0123456789abcdef)", s)
	}
	nsID, err := ParseNamespaceID(ns)
	if err != nil {
		return Key{}, fmt.Errorf("key %q: %w", s, err)
	}
	hash, err := ParseHash(h)
	if err != nil {
		return Key{}, fmt.Errorf("key %q: %w", s, err)
	}
	return Key{NS: nsID, Hash: hash}, nil
}

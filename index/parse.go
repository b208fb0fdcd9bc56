package index

import (
	"fmt"
	"strconv"
	"strings"
)

// The text forms of block names, as Hash, NamespaceID and Key print them
// and the CLI reads them: a namespace id and a hash are 16 hex digits each,
// a key is NS/HASH. A person may also write a number the way Go, C and
// Python print one, 0x and 1 to 16 hex digits (0xab is 00000000000000ab).
// Decimal is not read: 16 decimal digits are also 16 hex digits, so the
// gRPC JSON mapping's decimal form of a fixed64 would be read wrong. The
// errors name what was wrong for a person; they carry
// no package prefix, since the caller says what it was parsing.

// parseHex64 parses 16 hex digits, or 0x (or 0X) and 1 to 16 of them;
// its error names what it parsed and, after the forms it reads, the other
// forms the caller reads (orAlso, "" for none).
func parseHex64(what, s, orAlso string) (uint64, error) {
	digits := s
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		digits = s[2:]
	} else if len(s) != 16 {
		digits = ""
	}
	v, err := strconv.ParseUint(digits, 16, 64)
	if err != nil || len(digits) > 16 { // ParseUint takes no sign, no 0x, no _ in base 16
		return 0, fmt.Errorf("%s %q is not 16 hex digits (or 0x and up to 16%s)", what, s, orAlso)
	}
	return v, nil
}

// ParseNamespaceID parses a namespace id (16 hex digits, or 0x and up to
// 16), or
// RESPNamespaceName, in any case, for RESPNamespace.
func ParseNamespaceID(s string) (NamespaceID, error) {
	if strings.EqualFold(s, RESPNamespaceName) {
		return RESPNamespace, nil
	}
	v, err := parseHex64("namespace", s, ", or "+RESPNamespaceName+" for the Redis-protocol values")
	if err != nil {
		return 0, err
	}
	return NamespaceID(v), nil
}

// ParseHash parses a block hash (16 hex digits, or 0x and up to 16).
func ParseHash(s string) (Hash, error) {
	v, err := parseHex64("hash", s, "")
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

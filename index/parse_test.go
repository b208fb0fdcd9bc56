package index

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	k := Key{NS: 0xab, Hash: 0x0123456789abcdef}
	if got, err := ParseKey(k.String()); err != nil || got != k {
		t.Fatalf("ParseKey(%q) = %v, %v; want %v", k.String(), got, err, k)
	}
	if got, err := ParseKey("REDIS/0000000000000001"); err != nil || got != (Key{NS: RESPNamespace, Hash: 1}) {
		t.Fatalf("ParseKey(REDIS/…) = %v, %v; want the Redis namespace", got, err)
	}
	for in, want := range map[string]string{
		"00000000000000ab":                  "is not NS/HASH",
		"ab/0123456789abcdef":               `namespace "ab" is not 16 hex digits (or 0x and up to 16, or redis`,
		"00000000000000ab/0123456789abcdeg": `hash "0123456789abcdeg" is not 16 hex digits`,
		"00000000000000ab/+123456789abcdef": `hash "+123456789abcdef" is not 16 hex digits`,
	} {
		if _, err := ParseKey(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseKey(%q) = %v, want an error with %q", in, err, want)
		}
	}
}

// A hash or namespace written with 0x, as Go, C and Python print numbers,
// reads as the same 16 hex digits; anything else that is not 16 hex digits
// is refused, decimal included.
func TestParseHashTakes0xHex(t *testing.T) {
	for in, want := range map[string]Hash{
		"0123456789abcdef":   0x0123456789abcdef,
		"0123456789ABCDEF":   0x0123456789abcdef,
		"0x0123456789abcdef": 0x0123456789abcdef,
		"0X123456789ABCDEF":  0x0123456789abcdef,
		"0xab":               0xab,
		"0xffffffffffffffff": 1<<64 - 1,
	} {
		if got, err := ParseHash(in); err != nil || got != want {
			t.Errorf("ParseHash(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0x", "ab", "0xg", "0x+ab", "0x-1", "0x_ab", "0x00000000000000000", "0xfffffffffffffffff",
		"00000000000000000", "1311768467463790320", "0o17", " 0123456789abcdef"} {
		if got, err := ParseHash(in); err == nil || !strings.Contains(err.Error(), "is not 16 hex digits (or 0x and up to 16)") {
			t.Errorf("ParseHash(%q) = %v, %v; want an error", in, got, err)
		}
	}
	if k, err := ParseKey("0xab/0x1"); err != nil || k != (Key{NS: 0xab, Hash: 1}) {
		t.Errorf("ParseKey(0xab/0x1) = %v, %v", k, err)
	}
}

func TestRESPKey(t *testing.T) {
	// The mapping is stored data: a change would orphan every value a node
	// holds for Redis clients.
	if got := RESPKey("user:1").String(); got != "2bb6277b2e718062/d9c7c4609e6080f3" {
		t.Fatalf("RESPKey(user:1) = %s, want 2bb6277b2e718062/d9c7c4609e6080f3", got)
	}
}

// FuzzParseKey: whatever a person types, ParseKey either fails or returns
// the key whose String (with the namespace spelled in hex) parses back.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"00000000000000ab/0123456789abcdef", "redis/0000000000000001", "x/y", "/", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKey(s)
		if err != nil {
			return
		}
		back, err := ParseKey(k.String())
		if err != nil || back != k {
			t.Fatalf("ParseKey(%q) = %v, whose String parses back as %v, %v", s, k, back, err)
		}
	})
}

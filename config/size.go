package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// ByteSize is a number of bytes written with an optional unit: "4096",
// "64KiB", "4 MiB", "1.5GiB", "10GB" (decimal units are powers of 1000,
// binary ones of 1024).
type ByteSize int64

var units = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1e3, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1e6, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1e9, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1e12, "tib": 1 << 40,
}

// ParseByteSize parses s as a ByteSize.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	// The number runs to the first rune that cannot be part of one ("1e6"
	// is a number; no unit starts with e).
	i := strings.IndexFunc(t, func(r rune) bool { return !unicode.IsDigit(r) && !strings.ContainsRune(".+-eE", r) })
	num, unit := t, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := units[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q: %q is not a number", s, num)
	}
	v := f * mult
	if v < 0 || v > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q is out of range", s)
	}
	return ByteSize(math.Round(v)), nil
}

// String formats b with the largest binary unit that divides it.
func (b ByteSize) String() string {
	for _, u := range []struct {
		name string
		v    int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.v == 0 {
			return strconv.FormatInt(int64(b)/u.v, 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

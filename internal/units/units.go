// Package units formats and parses byte counts for people: the one place
// the CLI, the client, the config and the tiers' messages get them from.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// FormatBytes formats n with a binary unit and one decimal: "512 B",
// "64.0 KiB", "5.0 MiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit || m <= -unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

var multipliers = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kb": 1e3, "kib": 1 << 10,
	"m": 1 << 20, "mb": 1e6, "mib": 1 << 20,
	"g": 1 << 30, "gb": 1e9, "gib": 1 << 30,
	"t": 1 << 40, "tb": 1e12, "tib": 1 << 40,
}

// ParseBytes parses a byte count with an optional unit: "4096", "64KiB",
// "4 MiB", "1.5GiB", "10GB". Decimal units are powers of 1000, binary ones
// (and the bare letters K, M, G, T) of 1024; units are case-insensitive.
// The count must be at least 0 and at most 2^62.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	// The number runs to the first rune that cannot be part of one ("1e6"
	// is a number; no unit starts with e).
	i := strings.IndexFunc(t, func(r rune) bool { return !unicode.IsDigit(r) && !strings.ContainsRune(".+-eE", r) })
	num, unit := t, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult, ok := multipliers[unit]
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
	return int64(math.Round(v)), nil
}

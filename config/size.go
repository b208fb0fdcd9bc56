package config

import (
	"strconv"

	"github.com/kvstrata/kvstrata/internal/units"
)

// ByteSize is a number of bytes written with an optional unit: "4096",
// "64KiB", "4 MiB", "1.5GiB", "10GB" (decimal units are powers of 1000,
// binary ones of 1024).
type ByteSize int64

// ParseByteSize parses s as a ByteSize (units.ParseBytes).
func ParseByteSize(s string) (ByteSize, error) {
	n, err := units.ParseBytes(s)
	return ByteSize(n), err
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

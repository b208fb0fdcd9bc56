package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSkipEntries reads a cluster.skip-entries list of raft log indices,
// "1234,5678": each a whole number > 0. Empty items are ignored, so ""
// lists none.
func ParseSkipEntries(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.ParseUint(part, 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a raft log index (a whole number > 0)", part)
		}
		out = append(out, n)
	}
	return out, nil
}

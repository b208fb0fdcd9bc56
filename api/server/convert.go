package server

import (
	"math"
	"time"
)

// The conversions of index types live in api/v1 (convert.go); this file
// holds the server's own.

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

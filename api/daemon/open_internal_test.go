package daemon

import (
	"testing"

	"github.com/kvstrata/kvstrata/config"
)

// The object store's tier keeps read buffers for the reads a restore keeps
// in flight, a segment each, and never fewer than four segments.
func TestReadBuffersFollowTheReadsInFlight(t *testing.T) {
	for _, tc := range []struct {
		fetch int
		want  int64
	}{{1, 4}, {16, 4}, {20, 5}, {32, 8}} {
		cfg := config.Default()
		cfg.FetchConcurrency = tc.fetch
		if got := readBuffers(cfg); got != tc.want*int64(cfg.S3.SegmentSize) {
			t.Errorf("fetch-concurrency %d: read buffers of %d bytes, want %d segments of %d", tc.fetch, got, tc.want, int64(cfg.S3.SegmentSize))
		}
	}
}

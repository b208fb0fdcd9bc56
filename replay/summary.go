package replay

import (
	"time"

	"github.com/kvstrata/kvstrata/trace"
)

// Summarize is the Report of results, one per request of reqs and all of
// them sent, over elapsed: the summary Run makes, for a replay that
// schedules requests its own way (the simulated replay, in virtual time).
func Summarize(reqs []trace.Request, results []Result, elapsed time.Duration) *Report {
	sent := make([]bool, len(reqs))
	for i := range sent {
		sent[i] = true
	}
	return newReport(reqs, results, sent, elapsed)
}

package disagg_test

import (
	"strings"
	"testing"
)

// A worker registers its engine's metrics and its connector's on one
// registry, which it serves at /metrics: no name may be claimed by both.
func TestEngineAndConnectorMetricsShareARegistry(t *testing.T) {
	w := newWorker(t, startCache(t)) // fails if a registration collides
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var engine, conn bool
	for _, mf := range mfs {
		switch {
		case mf.GetName() == "kvstrata_engine_onboarded_tokens_total":
			engine = true
		case strings.HasPrefix(mf.GetName(), "kvstrata_engine_offload_"):
			conn = true
		}
	}
	if !engine || !conn {
		t.Errorf("gathered the engine's metrics: %v, the connector's: %v; want both", engine, conn)
	}
}

package perf

import (
	"testing"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// TestFromProfileTakesTheWorkersLimits: a version-2 profile's worker
// limits become the model's; a profile without them gets the defaults.
func TestFromProfileTakesTheWorkersLimits(t *testing.T) {
	p := sim.DefaultProfile()
	p.Version = 2
	p.Worker = &sim.WorkerLimits{KVTokens: 65536, BlockTokens: 16, MaxNumSeqs: 64, MaxNumBatchedTokens: 1024}
	m, err := FromProfile(p)
	if err != nil {
		t.Fatal(err)
	}
	if m.KVTokens != 65536 || m.MaxSeqs != 64 || m.MaxBatched != 1024 {
		t.Errorf("model limits KV %d, seqs %d, batched %d; want the profile's 65536, 64, 1024", m.KVTokens, m.MaxSeqs, m.MaxBatched)
	}
	// 3000 tokens are a 1024-token chunk twice and 952 tokens.
	want := 2*p.Prefill.At(1024, 1) + p.Prefill.At(952, 1)
	if got := m.PrefillTime(3000); got != want {
		t.Errorf("PrefillTime(3000) = %v, want two 1024-token chunks and one of 952: %v", got, want)
	}
	d, err := FromProfile(sim.DefaultProfile())
	if err != nil {
		t.Fatal(err)
	}
	if d.KVTokens != DefaultKVTokens || d.MaxSeqs != DefaultMaxSeqs || d.MaxBatched != DefaultMaxBatched {
		t.Errorf("a version-1 profile's model: %+v, want the default limits", d)
	}
	p.Worker.MaxNumSeqs = -1
	if _, err := FromProfile(p); err == nil {
		t.Error("a profile with max_num_seqs -1 made a model")
	}
}

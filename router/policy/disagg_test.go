package policy

import (
	"errors"
	"math"
	"testing"
)

// TestUncachedCountsKVTieredCredits: whatever the Router's policy, Uncached
// is the prompt less the pool's blocks and the cache tiers' credit — the
// package doc's worked example, 11.37 tokens of 200 — and a candidate that
// does not fit the request is an error.
func TestUncachedCountsKVTieredCredits(t *testing.T) {
	r := newRouter(t, Config{Policy: LeastLoaded})
	req := Request{Tokens: 200, Blocks: 12}
	got, err := r.Uncached(req, Candidate{Worker: "w", Overlap: 4, Tiers: dram(8)})
	if err != nil || math.Abs(got-11.37) > 0.01 {
		t.Errorf("4 blocks in the pool, 8 in DRAM: %v uncached tokens (%v), want 11.37", got, err)
	}
	if got, _ := r.Uncached(req, Candidate{Worker: "w"}); got != 200 {
		t.Errorf("nothing cached: %v uncached tokens, want 200", got)
	}
	if _, err := r.Uncached(req, Candidate{Worker: "w", Overlap: 13}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("an overlap past the prompt: %v, want ErrBadRequest", err)
	}
	if l := r.Load("w"); l != (Load{}) {
		t.Errorf("Uncached changed the load: %+v", l)
	}
}

// TestPredictReplacesThePrefillPrediction: a sequence chosen by
// least-loaded predicts its whole prompt; Predict replaces that in its
// worker's load until the first token, and is ignored after it.
func TestPredictReplacesThePrefillPrediction(t *testing.T) {
	r := newRouter(t, Config{Policy: LeastLoaded})
	d, err := r.Choose(Request{Tokens: 200, Blocks: 12}, []Candidate{{Worker: "w"}})
	if err != nil {
		t.Fatal(err)
	}
	if l := r.Load("w"); l.PrefillTokens != 200 {
		t.Fatalf("prefill load %v, want the whole prompt's 200", l.PrefillTokens)
	}
	d.Seq.Predict(8)
	if l := r.Load("w"); l.PrefillTokens != 8 || l.Prefilling != 1 || l.Blocks != 13 {
		t.Errorf("after Predict(8): %+v, want 8 prefill tokens, 1 prefilling, 13 blocks", l)
	}
	d.Seq.FirstToken()
	d.Seq.Predict(50)
	if l := r.Load("w"); l.PrefillTokens != 0 || l.Decoding != 1 {
		t.Errorf("Predict after the first token changed the load: %+v", l)
	}
	d.Seq.Done()
	if l := r.Load("w"); l != (Load{}) {
		t.Errorf("after Done: %+v", l)
	}
	var none *Sequence
	none.Predict(1) // a nil Sequence does nothing
}

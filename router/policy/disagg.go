package policy

// Disaggregated serving chooses a decode worker by its load (an Override
// of LeastLoaded, which predicts the whole prompt as that worker's prefill)
// and then decides where the prompt is prefilled. These two let the caller
// ask what a candidate would really compute and correct the chosen
// Sequence's prediction to match.

// Uncached is the prefill tokens candidate c leaves to compute for req
// under kv-tiered's credits, whatever the Router's policy: the prompt less
// the blocks in c's pool and the blocks' worth of recompute its restores
// from the cache tiers save. It changes nothing.
func (r *Router) Uncached(req Request, c Candidate) (float64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.check(req, []Candidate{c}); err != nil {
		return 0, err
	}
	nt, _ := r.newTokens(req, &c, KVTiered)
	return nt, nil
}

// Predict replaces the sequence's predicted prefill tokens, which count in
// its worker's load until FirstToken, with tokens (negative counts as 0).
// It does nothing once the first token came, or on a nil Sequence.
func (s *Sequence) Predict(tokens float64) {
	if s == nil {
		return
	}
	tokens = max(tokens, 0)
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if s.state != seqPrefill {
		return
	}
	s.r.loads[s.worker].PrefillTokens += tokens - s.prefill
	s.prefill = tokens
}

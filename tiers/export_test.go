package tiers

import "fmt"

// CheckReadIndex reports the first key on which h's read index and its
// entries disagree: a key a level holds must be in the index with its
// entry and its levels, and the index must hold no other key.
func CheckReadIndex(h *Hierarchy) error {
	h.lock()
	defer h.mu.Unlock()
	n := 0
	for k, e := range h.entries {
		got := h.readable.get(k)
		if e.in == 0 {
			if got != (held{}) {
				return fmt.Errorf("%v: held nowhere, the read index has it in %08b", k, got.in)
			}
			continue
		}
		n++
		if got.e != e || got.in != e.in {
			return fmt.Errorf("%v: held in %08b, the read index says %08b (same entry: %t)", k, e.in, got.in, got.e == e)
		}
	}
	for i := range h.readable.shards {
		s := &h.readable.shards[i]
		s.mu.RLock()
		n -= len(s.m)
		s.mu.RUnlock()
	}
	if n != 0 {
		return fmt.Errorf("the read index holds %d keys more than the levels", -n)
	}
	return nil
}

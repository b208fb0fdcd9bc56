package policy

import (
	"fmt"
	"strings"
)

// Validate reports every problem of o's set fields in one error wrapping
// ErrBadConfig, or nil. An Override that passes turns a valid Config into
// a valid one, so Choose does not refuse it.
func (o *Override) Validate() error {
	if o == nil {
		return nil
	}
	var probs []string
	if o.Policy != nil && int(*o.Policy) >= len(policyNames) {
		probs = append(probs, fmt.Sprintf("policy is %d, not a known policy", *o.Policy))
	}
	// Unset knobs take values that pass, so that only the set ones speak.
	weight, temp, busy := 1.0, 0.0, 0.0
	if o.OverlapWeight != nil {
		weight = *o.OverlapWeight
	}
	if o.Temperature != nil {
		temp = *o.Temperature
	}
	if o.BusyBlockFraction != nil {
		busy = *o.BusyBlockFraction
	}
	probs = checkKnobs(probs, weight, temp, busy)
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: override: %s", ErrBadConfig, strings.Join(probs, "; "))
}

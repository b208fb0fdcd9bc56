package frontend

import (
	"fmt"
	"strings"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/router/policy"
)

// override is the policy Override of a request's routing override (the
// OpenAI API's "kvstrata" object), nil for none. A bad one is an error
// wrapping sched.ErrBadRequest, which the API answers 400: the request is
// not routed.
func override(rt *sched.Routing) (*policy.Override, error) {
	if rt == nil {
		return nil, nil
	}
	o := &policy.Override{
		OverlapWeight: rt.OverlapWeight, Temperature: rt.Temperature,
		BusyBlockFraction: rt.BusyBlockFraction, BusyPrefillTokens: rt.BusyPrefillTokens,
	}
	if rt.Policy != nil {
		p, err := policy.ParsePolicy(*rt.Policy)
		if err != nil {
			return nil, fmt.Errorf("%w: kvstrata.policy: %s", sched.ErrBadRequest, strings.TrimPrefix(err.Error(), "policy: "))
		}
		o.Policy = &p
	}
	if err := o.Validate(); err != nil {
		msg := strings.TrimPrefix(err.Error(), policy.ErrBadConfig.Error()+": override: ")
		return nil, fmt.Errorf("%w: the kvstrata routing override: %s", sched.ErrBadRequest, msg)
	}
	return o, nil
}

package sched

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Routing is a request's routing override, the "kvstrata" object of an
// OpenAI API request: a router in front of workers (`kvstrata frontend`)
// routes that one request with these settings instead of its flags', and an
// engine ignores it. Each field is the frontend flag of the same name
// (dashes as underscores); nil keeps the flag's value. The router checks the
// values: a bad one fails the request with ErrBadRequest before it is
// routed.
type Routing struct {
	// Policy is a routing policy's name: kv-tiered, kv-hbm, least-loaded,
	// random or round-robin.
	Policy *string `json:"policy,omitempty"`
	// Temperature is the routing temperature (≥ 0), not the sampling one.
	Temperature *float64 `json:"temperature,omitempty"`
	// OverlapWeight weighs prefill work against decode load (> 0).
	OverlapWeight *float64 `json:"overlap_weight,omitempty"`
	// BusyBlockFraction and BusyPrefillTokens are the busy thresholds;
	// negative means never busy.
	BusyBlockFraction *float64 `json:"busy_block_fraction,omitempty"`
	BusyPrefillTokens *int     `json:"busy_prefill_tokens,omitempty"`
}

// routingFields is Routing's field names, for the error about one it lacks.
const routingFields = "policy, temperature, overlap_weight, busy_block_fraction, busy_prefill_tokens"

// UnmarshalJSON decodes a Routing, refusing a field it does not know: a
// misspelt override must not be ignored silently.
func (r *Routing) UnmarshalJSON(b []byte) error {
	type plain Routing
	var p plain
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			return fmt.Errorf("kvstrata.%s: expected %s, got JSON %s", te.Field, te.Type, te.Value)
		case errors.As(err, &te):
			return fmt.Errorf("kvstrata: expected an object of %s, got JSON %s", routingFields, te.Value)
		}
		return fmt.Errorf("kvstrata: %s (its fields: %s)", strings.TrimPrefix(err.Error(), "json: "), routingFields)
	}
	*r = Routing(p)
	return nil
}

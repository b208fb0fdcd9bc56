package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/router/frontend"
	"github.com/kvstrata/kvstrata/router/policy"
)

// addRoutingFlags binds the frontend's routing and failure-detection
// settings beyond its first few flags: with those, every field of
// policy.Config but the block size (the model's) and every bound of
// frontend.Config is a flag. A request overrides some of them with its
// "kvstrata" object.
func addRoutingFlags(t *flagTable, cfg *frontend.Config) {
	p := &cfg.Policy
	t.add("tie-break", "string", "random", "how --temperature 0 chooses among equally cheap workers: random or lowest-index", func(v string) error {
		switch v {
		case "random":
			p.TieBreak = policy.TieRandom
		case "lowest-index":
			p.TieBreak = policy.TieLowestIndex
		default:
			return fmt.Errorf("want random or lowest-index")
		}
		return nil
	})
	t.float("busy-block-fraction", 0.95, "a worker whose active KV blocks reach this fraction of --num-gpu-blocks is busy (negative: never)", &p.BusyBlockFraction)
	t.int("busy-prefill-tokens", 65536, "a worker with this many prompt tokens waiting for their first token is busy (negative: never)", &p.BusyPrefillTokens)
	t.uint64("route-seed", 0, "seed of the router's random choices (random policy, temperature, ties)", &p.Seed)
	def := policy.DefaultTierCosts()
	var bws, lats []string
	for i, c := range def {
		name := index.TierKind(i + 1).String()
		bws = append(bws, fmt.Sprintf("%s=%sGB/s", name, strconv.FormatFloat(c.Bandwidth/1e9, 'g', -1, 64)))
		lats = append(lats, fmt.Sprintf("%s=%v", name, c.Latency))
	}
	t.add("tier-bandwidth", "tier=rate,...", strings.Join(bws, ","),
		`restore bandwidth of each cache tier, bytes a second ("none": the tier earns no credit); tiers not named keep their default`, func(v string) error {
			return eachTier(v, func(i int, s string) error {
				if s == "none" {
					p.Tiers[i].Bandwidth = -1
					return nil
				}
				n, err := units.ParseBytes(strings.TrimSuffix(s, "/s"))
				if err != nil || n < 1 {
					return fmt.Errorf("%q is not a positive size a second (e.g. 2GB/s)", s)
				}
				p.Tiers[i].Bandwidth = float64(n)
				return nil
			})
		})
	t.add("tier-latency", "tier=duration,...", strings.Join(lats, ","),
		"time to the first block of a restore from each cache tier; tiers not named keep their default", func(v string) error {
			return eachTier(v, func(i int, s string) error {
				d, err := time.ParseDuration(s)
				if err != nil || d <= 0 {
					return fmt.Errorf("%q is not a positive duration", s)
				}
				p.Tiers[i].Latency = d
				return nil
			})
		})
	t.add("sim-profile", "string", "", "the workers' step-time profile file (engine/model/sim JSON), whose prefill curve gives each block's recompute time (default: the sim model's)", func(v string) error {
		p.Profile = nil
		if v == "" {
			return nil
		}
		prof, err := sim.ReadProfile(v)
		if err != nil {
			return err
		}
		p.Profile = &prof
		return nil
	})
	t.duration("health-timeout", frontend.DefaultHealthTimeout, "longest wait for a worker's /health", &cfg.HealthTimeout)
	t.duration("probe-max", frontend.DefaultProbeMax, "longest wait between probes of a worker out of the candidates (they start at --health-interval and double)", &cfg.ProbeMax)
	t.duration("stall-timeout", frontend.DefaultStallTimeout, "a worker's stream silent this long (no first token yet, or no byte since its last) is stalled once the worker also fails its health checks: it leaves the candidates and the request moves on (negative: never)", &cfg.StallTimeout)
	t.duration("stall-limit", frontend.DefaultStallLimit, "a stream silent this long is stalled whatever its worker's health (allow for a long prefill behind a full queue; negative: no limit)", &cfg.StallLimit)
}

// eachTier calls set for each tier=value of a comma-separated list, with
// the tier's index in policy.Config.Tiers.
func eachTier(list string, set func(i int, v string) error) error {
	if list == "" {
		return nil
	}
	var probs []string
	for _, kv := range strings.Split(list, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			probs = append(probs, fmt.Sprintf("%q is not tier=value", kv))
			continue
		}
		tier, err := index.ParseTierKind(k)
		if err != nil {
			probs = append(probs, err.Error())
			continue
		}
		if err := set(int(tier)-1, v); err != nil {
			probs = append(probs, k+": "+err.Error())
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%s", strings.Join(probs, "; "))
	}
	return nil
}

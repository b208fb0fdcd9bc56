package planner

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Defaults of a Config's zero fields.
const (
	DefaultInterval     = 30 * time.Second
	DefaultStartupDelay = 60 * time.Second
	DefaultCooldown     = 5 * time.Minute
	DefaultPredictor    = "kalman"
	DefaultBand         = 0.15
	DefaultDownStable   = 3
	DefaultIdleWindows  = 2
	DefaultRespect      = 10 * time.Minute
)

// ErrBadConfig marks a Config that New refuses.
var ErrBadConfig = errors.New("planner: bad config")

// EnsureDefaults sets every zero field of c to its default.
func (c *Config) EnsureDefaults() {
	if c.Mode == "" {
		c.Mode = ModeActive
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.StartupDelay == 0 {
		c.StartupDelay = DefaultStartupDelay
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.Predictor == "" {
		c.Predictor = DefaultPredictor
	}
	if c.Band == 0 {
		c.Band = DefaultBand
	}
	if c.DownStable == 0 {
		c.DownStable = DefaultDownStable
	}
	if c.IdleWindows == 0 {
		c.IdleWindows = DefaultIdleWindows
	}
	if !c.Manual.Override && c.Manual.Respect == 0 {
		c.Manual.Respect = DefaultRespect
	}
}

// Validate reports every problem of c in one error wrapping ErrBadConfig.
func (c Config) Validate() error {
	var probs []string
	bad := func(f string, a ...any) { probs = append(probs, fmt.Sprintf(f, a...)) }
	if c.Mode != ModeActive && c.Mode != ModeAdvisory {
		bad("mode %q: want %s or %s", c.Mode, ModeActive, ModeAdvisory)
	}
	for name, d := range map[string]time.Duration{"interval": c.Interval, "TTFT target": c.TTFT, "ITL target": c.ITL} {
		if d <= 0 {
			bad("%s is %v, must be > 0", name, d)
		}
	}
	if !(c.TTFTQuantile >= 0 && c.TTFTQuantile < 1) {
		bad("TTFT quantile is %v, must be 0 (the mean) or in (0, 1)", c.TTFTQuantile)
	}
	if c.StartupDelay < 0 || c.Cooldown < 0 || c.Manual.Respect < 0 {
		bad("startup delay %v, cooldown %v and manual respect %v must be ≥ 0", c.StartupDelay, c.Cooldown, c.Manual.Respect)
	}
	if !(c.has(Aggregated) && len(c.Pools) == 1 || c.has(Prefill) && c.has(Decode) && len(c.Pools) == 2) {
		bad("pools: want aggregated alone, or prefill and decode")
	}
	sumMin := 0
	for _, p := range c.pools() {
		l := c.Pools[p]
		if p != Aggregated && p != Prefill && p != Decode {
			bad("pool %q is unknown: want %s, %s or %s", p, Aggregated, Prefill, Decode)
		}
		if l.Min < 0 || l.Max < 1 || l.Max < l.Min {
			bad("pool %s limits %d-%d: want 0 ≤ min ≤ max, max ≥ 1", p, l.Min, l.Max)
		}
		sumMin += l.Min
	}
	if c.Budget < 0 || c.Budget > 0 && c.Budget < sumMin {
		bad("budget %d is below the pools' minimums (%d)", c.Budget, sumMin)
	}
	if !(c.Band >= 0) || math.IsInf(c.Band, 0) {
		bad("band %v must be ≥ 0", c.Band)
	}
	if c.DownStable < 1 || c.IdleWindows < 1 || c.MaxDownStep < 0 {
		bad("down-stable %d and idle windows %d must be ≥ 1, max down step %d ≥ 0", c.DownStable, c.IdleWindows, c.MaxDownStep)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

func (c Config) has(p Pool) bool { _, ok := c.Pools[p]; return ok }

// pools are c's pools in a stable order.
func (c Config) pools() []Pool {
	ps := make([]Pool, 0, len(c.Pools))
	for p := range c.Pools {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

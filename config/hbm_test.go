package config

import (
	"strings"
	"testing"
)

func TestAnHBMTierNeedsABinaryWithIt(t *testing.T) {
	c := Default()
	c.HBM.Capacity = 8 << 30
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "hbm.capacity is 8GiB, but this binary was built without the HBM tier") {
		t.Fatalf("hbm.capacity in a binary without the cuda tag: %v", err)
	}
	HBMBuilt = true
	defer func() { HBMBuilt = false }()
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "hbm") {
		t.Fatalf("a valid HBM tier: %v", err)
	}
	c.HBM.PageSize, c.HBM.Policy, c.HBM.Capacity, c.HBM.GDS = 1000, "fifo", 1<<20, "always"
	err = c.Validate()
	for _, want := range []string{"hbm.page-size", "hbm.policy", "hbm.capacity 1MiB is below limits.max-block-size", `hbm.gds "always"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad HBM settings: %v; want it to name %s", err, want)
		}
	}
}

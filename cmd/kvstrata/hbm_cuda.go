//go:build cuda

package main

import (
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/hbm"
)

// A binary built with the cuda tag (make build-cuda) has the GPU-memory
// tier: --hbm-capacity turns it on. The CUDA driver is loaded when the
// tier opens, so the binary starts on machines without one as long as the
// tier is off.
func init() {
	config.HBMBuilt = true
	openHBM = func(c config.HBM, maxBlockSize int64) (tiers.Tier, error) {
		return hbm.Open(hbm.Config{Device: c.Device, Capacity: int64(c.Capacity), PageSize: int(c.PageSize),
			MaxBlockSize: min(maxBlockSize, int64(c.Capacity)), GDS: c.GDS, GDSTrustDisk: c.GDSTrustDisk})
	}
}

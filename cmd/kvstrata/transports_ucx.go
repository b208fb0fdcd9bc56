//go:build ucx

package main

import (
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// A binary built with the ucx tag (make build-ucx) serves the data plane
// over UCX when --transport ucx says so, over the transports --ucx-tls
// names (UCX's own choice when empty) and the devices --ucx-net-devices
// allows.
func init() {
	// UCX keeps its own transports and is not encrypted: trusted networks
	// only (config.CheckExposure refuses it on other addresses without
	// insecure.allow-remote).
	transports["ucx"] = func(cfg config.Config, _ *tlsfiles.Files) (transfer.Transport, error) {
		return ucx.New(ucx.Options{
			MaxBlockSize: int(cfg.Limits.MaxBlockSize),
			MaxBlocks:    cfg.Limits.MaxBatchBlocks,
			MaxConns:     cfg.Limits.MaxConnections,
			TLS:          cfg.UCX.TLS,
			NetDevices:   cfg.UCX.NetDevices,
		}), nil
	}
	config.Transports = append(config.Transports, "ucx")
}

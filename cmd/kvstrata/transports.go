package main

import (
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// transports are the data-plane backends built into this binary, by name;
// files behind build tags add theirs (and to config.Transports) in init.
var transports = map[string]func(config.Config, *tlsfiles.Files) (transfer.Transport, error){
	"tcp": func(cfg config.Config, files *tlsfiles.Files) (transfer.Transport, error) {
		serverTLS, clientTLS := daemon.DataPlaneTLS(files) // nil, nil: plain TCP
		return tcp.New(tcp.Options{
			ServerTLS:    serverTLS,
			ClientTLS:    clientTLS,
			MaxBlockSize: int(cfg.Limits.MaxBlockSize),
			MaxBlocks:    cfg.Limits.MaxBatchBlocks,
			MaxConns:     cfg.Limits.MaxConnections,
			// Stalled puts hold at most this much of the DRAM tier, and
			// requests arrive at a pace or are cut.
			MaxPendingBytes: int64(cfg.Limits.MaxPendingPutBytes),
			RequestTimeout:  cfg.Limits.RequestTimeout,
			MinRate:         int64(cfg.Limits.MinRequestRate),
		}), nil
	},
}

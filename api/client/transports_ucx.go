//go:build ucx

package client

import (
	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/ucx"
)

// A client built with the ucx tag also speaks UCX to nodes that serve it,
// with UCX's own choice of transports (UCX_TLS and UCX_NET_DEVICES in the
// environment narrow it).
func init() {
	extraTransports = append(extraTransports, func(maxBlockSize, maxBlocks int) transfer.Transport {
		return ucx.New(ucx.Options{MaxBlockSize: maxBlockSize, MaxBlocks: maxBlocks})
	})
}

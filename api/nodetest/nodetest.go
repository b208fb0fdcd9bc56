// Package nodetest serves a cache node in-process on loopback — the gRPC
// service and the TCP data plane, as kvstrata serve wires them — over two
// DRAM arenas, the second labelled SSD, for the tests of the node's
// clients (api/client, kvctl, loadgen).
package nodetest

import (
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/api/dataplane"
	"github.com/kvstrata/kvstrata/api/gate"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/server"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// Options shape the node; zero fields take the defaults.
type Options struct {
	DRAMBytes int64 // default 16 MiB
	SSDBytes  int64 // the second arena; default 8 MiB
	Limits    node.Config
	// Inline moves blocks between the tiers in the calling goroutine, so
	// that a test sees each demotion at once; else a background mover does.
	Inline bool
	// Below are more levels under the two arenas (an object store).
	Below []tiers.LevelConfig
	// Freshness, if set, is what lookups say of the directory's
	// freshness, as a cluster member's do.
	Freshness func() *pb.Freshness
	// DataAddr, if set, is the data-plane address Info names instead of
	// the one the node serves on.
	DataAddr string
	// Quotas, if set, makes the tiers count tenants (tiers.Config.Tenants)
	// and keep them within these quotas; TenantName names them in Stats.
	Quotas     tiers.Quotas
	TenantName func(index.TenantTag) string
	// Auth, if set, makes the node authenticate its clients, as a node
	// with a users file does: gRPC calls through api/gate, data-plane
	// connections through their hello.
	Auth gate.Authenticator
}

// Node is a served node.
type Node struct {
	*node.Node
	Addr string // gRPC address
	// DataAddr is the address the data plane serves on (Info names
	// Options.DataAddr instead, when set: a proxy in front of it, say).
	DataAddr string
}

// Start serves a node until the test ends.
func Start(t testing.TB, opts Options) *Node {
	t.Helper()
	if opts.DRAMBytes == 0 {
		opts.DRAMBytes = 16 << 20
	}
	if opts.SSDBytes == 0 {
		opts.SSDBytes = 8 << 20
	}
	limits := opts.Limits
	limits.EnsureDefaults()
	var levels []tiers.LevelConfig
	for _, l := range []struct {
		kind  index.TierKind
		bytes int64
	}{{index.TierDRAM, opts.DRAMBytes}, {index.TierSSD, opts.SSDBytes}} {
		tr, err := dram.New(dram.Config{Capacity: l.bytes, MaxBlockSize: min(limits.MaxBlockSize, l.bytes)})
		if err != nil {
			t.Fatal(err)
		}
		levels = append(levels, tiers.LevelConfig{Kind: l.kind, Tier: tr})
	}
	levels = append(levels, opts.Below...)
	h, err := tiers.New(tiers.Config{Levels: levels, Inline: opts.Inline, Tenants: opts.Quotas != nil})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Quotas != nil {
		if err := h.SetQuotas(opts.Quotas); err != nil {
			t.Fatal(err)
		}
	}
	n, err := node.New(h, limits)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	handler := dataplane.NewHandler(n, nil)
	var gopts []grpc.ServerOption
	if opts.Auth != nil {
		handler = handler.WithAuth(opts.Auth)
		gopts = gate.New(opts.Auth).ServerOptions()
	}
	dl, err := tcp.New(tcp.Options{MaxBlockSize: int(limits.MaxBlockSize), MaxBlocks: limits.MaxBatchBlocks}).
		Listen("127.0.0.1:0", handler)
	if err != nil {
		t.Fatal(err)
	}
	addrs := server.Addrs{GRPC: lis.Addr().String(), Data: dl.Addr(), Transport: "tcp"}
	if opts.DataAddr != "" {
		addrs.Data = opts.DataAddr
	}
	g := grpc.NewServer(gopts...)
	server.Register(g, n, server.Options{Addrs: addrs, Freshness: opts.Freshness, TenantName: opts.TenantName})
	go g.Serve(lis)
	t.Cleanup(func() {
		dl.Close()
		g.Stop()
		n.Close()
	})
	return &Node{Node: n, Addr: lis.Addr().String(), DataAddr: dl.Addr()}
}

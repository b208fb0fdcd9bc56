// Package daemon assembles a cache node from its configuration and runs it
// as a part of a process (internal/lifecycle): the cluster membership, the
// tiers, the node, and its servers — gRPC, the data plane, the Redis
// protocol, metrics and health. It is the top of the api/ floor, the one
// package there that reads a config.Config; `kvstrata serve` runs one Node,
// and a process that runs more parts (a cache node, workers, a frontend)
// runs it beside them.
//
// Start brings the node up in this order: a hold on the data directory and
// the SSD tier's (internal/dirlock), so that a second node on either is
// refused at once; the cluster (raft), since the tiers publish their
// changes to it from the moment they load; the tiers and the node; the
// listeners (gRPC, data plane, RESP, HTTP), so that every address is known
// before the gRPC service that reports them is made; the gRPC server; the
// node's member record in the cluster; a wait until the directory lists
// what the tiers loaded. Only then is it ready. Stop takes it down in the
// order that lets requests in flight finish: not ready, data plane and
// RESP drained, gRPC stopped gracefully (cut at the deadline), HTTP, the
// tiers, the cluster, and the directories' holds last.
//
// Ready and Failed are safe for concurrent use; Start and Stop are called
// once each, Stop only after a Start that succeeded.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/kvstrata/kvstrata/api/dataplane"
	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/api/metrics"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
	"github.com/kvstrata/kvstrata/api/server"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/gpu/gpustat"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/dirlock"
	"github.com/kvstrata/kvstrata/internal/grpctls"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/raftstore"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/transfer"
)

// Options are what a Node needs besides its configuration.
type Options struct {
	// Logger receives the node's lines. The default is slog.Default().
	Logger *slog.Logger
	// Version is the version the node reports. The default is "dev".
	Version string
	// Transport serves the data plane; required when the configuration
	// listens for it (listen.data), built from the configuration by the
	// binary, which knows which backends it has.
	Transport transfer.Transport
	// HBM opens the GPU-memory tier; required when the configuration
	// asks for one (hbm.capacity), given by binaries built with the cuda
	// tag.
	HBM func(cfg config.HBM, maxBlockSize int64) (tiers.Tier, error)
	// TLS is the node's TLS material (LoadTLS), the same the binary gave
	// the Transport; nil: New loads it from the configuration.
	TLS *tlsfiles.Files
}

// Node is a cache node as one part of a process.
type Node struct {
	cfg  config.Config
	opts Options
	log  *slog.Logger

	ready  atomic.Bool // started and not stopping
	failed chan error  // a server that stopped on its own
	sec    *security   // TLS and the cluster token

	// reloaders are what Reload reads again, in order, on SIGHUP.
	reloaders []reloader

	tenants tenants // the users file's, set by SetTenants

	// Set by Start.
	dirs       []*dirlock.Lock // the node's directories, held while it runs
	cl         *membership.Agent
	h          *tiers.Hierarchy
	n          *node.Node
	g          *grpc.Server
	hs         *healthServer
	hsrv       *http.Server
	addrs      server.Addrs
	stops      []func(context.Context) // data plane, RESP: drained on Stop, in reverse
	keys       resp.Store              // the node's own RESP keys, served to the other nodes
	users      *auth.Holder            // the users file, nil without one (auth.go)
	respTLS    string                  // listen.resp-tls, advertised
	healthDone chan struct{}
	gpus       *gpustat.Devices // nil without NVML
}

// New returns a cache node of cfg (a resolved configuration), not started.
func New(cfg config.Config, opts Options) (*Node, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if cfg.Listen.Data != "" && opts.Transport == nil {
		return nil, fmt.Errorf("daemon: the data plane is to listen on %s, but no transport is given", cfg.Listen.Data)
	}
	if cfg.HBM.Capacity > 0 && opts.HBM == nil {
		return nil, errors.New("daemon: hbm.capacity is set, but this binary has no HBM tier (build it with the cuda tag)")
	}
	if err := cfg.CheckExposure(); err != nil {
		return nil, err
	}
	sec, err := openSecurity(cfg, opts.TLS)
	if err != nil {
		return nil, err
	}
	d := &Node{cfg: cfg, opts: opts, log: opts.Logger, failed: make(chan error, 4), sec: sec}
	if sec.tls != nil {
		d.reloaders = append(d.reloaders, reloader{"tls", sec.tls.Reload})
	}
	if sec.cluster != nil {
		d.reloaders = append(d.reloaders, reloader{"cluster token", sec.cluster.Reload})
	}
	d.reloaders = append(d.reloaders, reloader{"users file", d.ReloadUsers}) // a no-op without one
	return d, nil
}

// Name names the part.
func (d *Node) Name() string { return "cache node" }

// Failed yields the error of a server that stopped on its own.
func (d *Node) Failed() <-chan error { return d.failed }

// Ready is nil while the node is started, not stopping, and its replica
// of the directory is current (/readyz).
func (d *Node) Ready() error {
	if !d.ready.Load() {
		return errors.New("starting or shutting down")
	}
	return d.cl.Ready()
}

// Addrs are the addresses the node's servers are dialled at (advertised;
// the listen addresses unless advertise.* says otherwise), once Start has
// returned nil: what a part beside it in the process dials.
func (d *Node) Addrs() server.Addrs { return d.addrs }

// Start opens and starts everything, in the order the package comment
// gives; if a step fails, it closes what it opened, in reverse.
func (d *Node) Start(ctx context.Context) (err error) {
	start := time.Now()
	cfg, log := d.cfg, d.log
	var undo []func() // closes what is open so far, in reverse, if starting fails
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	if d.dirs, err = holdDirs(cfg); err != nil {
		return err
	}
	undo = append(undo, d.releaseDirs)

	// Who may come in; then the cluster: the tiers publish their changes
	// to it from the moment they load.
	if d.users, err = openUsers(cfg); err != nil {
		return err
	}
	if err := d.applyTenants(); err != nil {
		return err
	}
	gk, clusterToken, err := openGate(d.sec.cluster, d.users)
	if err != nil {
		return err
	}
	if gk != nil && cfg.Auth.ClusterTokenFile == "" && (cfg.Cluster.Join != "" || strings.Contains(cfg.Cluster.Bootstrap, ",")) {
		log.Warn("this node authenticates its callers but has no auth.cluster-token-file: the other members' calls are refused unless their certificates are in the users file as members")
	}
	cl, err := openCluster(cfg, log, d.sec, peerDialOptions(clusterToken))
	if err != nil {
		return err
	}
	undo = append(undo, func() { cl.Close() })
	self := index.NodeID(cfg.NodeID)
	cl.Publish(index.Change{Kind: index.ChangeNodeDropped, Loc: index.Location{Node: self}}) // what a crash left listed
	h, err := openTiers(ctx, cfg, log, d.opts.HBM, cl.Publish)
	if err != nil {
		return err
	}
	if err := d.tenants.open(h); err != nil {
		h.Close()
		return err
	}
	n, err := node.New(h, node.Config{MaxBlockSize: int64(cfg.Limits.MaxBlockSize),
		MaxBatchBlocks: cfg.Limits.MaxBatchBlocks, MaxBatchBytes: int64(cfg.Limits.MaxBatchBytes),
		FetchConcurrency: cfg.FetchConcurrency, Directory: cl})
	if err != nil {
		h.Close()
		return err
	}
	undo = append(undo, func() { n.Close() })
	m := metrics.New(h.Stats, map[string]string{"version": d.opts.Version, "node_id": fmt.Sprint(cfg.NodeID), "transport": cfg.Transport})
	m.WatchCluster(clusterMetrics(cl))
	m.NameTenants(d.tenants.name)
	gpus := openGPUs(m.Registry, log)
	if gpus != nil {
		undo = append(undo, func() { gpus.Close() })
	}

	// The listeners, so that every address is known before the services
	// that report them are made.
	glis, err := net.Listen("tcp", cfg.Listen.GRPC)
	if err != nil {
		return fmt.Errorf("listen grpc %s: %w", cfg.Listen.GRPC, err)
	}
	undo = append(undo, func() { glis.Close() })
	// Every address the node reports is the one others dial (advertise.*),
	// never a wildcard it listens on.
	addrs := server.Addrs{Transport: cfg.Transport}
	if addrs.GRPC, err = cfg.AdvertisedAddr("listen.grpc", glis.Addr().String()); err != nil {
		return err
	}

	// Data plane.
	if cfg.Listen.Data != "" {
		dh := dataplane.NewHandler(n, m.ObserveData)
		if gk != nil {
			dh = dh.WithAuth(gk)
		}
		l, err := d.opts.Transport.Listen(cfg.Listen.Data, dh)
		if err != nil {
			return fmt.Errorf("listen data %s: %w", cfg.Listen.Data, err)
		}
		if addrs.Data, err = cfg.AdvertisedAddr("listen.data", l.Addr()); err != nil {
			l.Close()
			return err
		}
		// The detail says what the transport uses (the listener's Describe,
		// for ucx: with how blocks in GPU memory travel) and, with an HBM
		// tier, how many bytes of its blocks left each way.
		var parts []func() string
		if ds, ok := l.(interface{ Describe() string }); ok {
			parts = append(parts, ds.Describe)
		} else if cfg.HBM.Capacity > 0 {
			parts = append(parts, func() string { return "device memory: staged through pinned host memory" })
		}
		if cfg.HBM.Capacity > 0 {
			parts = append(parts, dh.DeviceDetail)
			m.WatchDeviceBytes(dh.DeviceBytes)
		}
		if len(parts) > 0 {
			addrs.TransportDetail = func() string {
				s := make([]string, len(parts))
				for i, p := range parts {
					s[i] = p()
				}
				return strings.Join(s, "; ")
			}
			log.Info("data plane", "transport", cfg.Transport, "detail", addrs.TransportDetail())
		}
		d.stops = append(d.stops, func(ctx context.Context) {
			if dr, ok := l.(transfer.Drainer); ok { // let gets and puts in flight finish
				if err := dr.Shutdown(ctx); err != nil {
					log.Warn("data plane: requests cut at the shutdown deadline", "err", err)
				}
				return
			}
			l.Close()
		})
		undo = append(undo, func() { l.Close() })
	}

	// Redis protocol.
	if cfg.Listen.RESP != "" || cfg.Listen.RESPTLS != "" {
		// A command carries one value and its key (the slack); it holds at
		// most its bytes plus one value's while that grows, so
		// MaxCommandBytes+MaxBulkLen ≤ pending, as config checks.
		maxBulk, pending := int64(cfg.Limits.MaxValueSize), int64(cfg.Limits.MaxPendingRESPBytes)
		local := respnode.New(n)
		store, peers, err := keyspace(local, cl, self, cfg.Limits.RequestTimeout, log.With("server", "resp"), d.sec.peerCredentials(), peerDialOptions(clusterToken))
		if err != nil {
			return err
		}
		d.keys = local
		d.stops = append(d.stops, func(context.Context) { peers.close() }) // after RESP's
		undo = append(undo, peers.close)
		rs, err := resp.NewServer(store, &resp.Config{MaxClients: cfg.Limits.MaxConnections,
			MaxBulkLen: maxBulk, MaxBulkLenSetting: "limits.max-value-size",
			MaxCommandBytes: max(maxBulk+config.RESPCommandSlack, min(resp.DefaultMaxCommandBytes, pending-maxBulk)),
			MaxPendingBytes: pending, CommandTimeout: cfg.Limits.RequestTimeout,
			MinReadRate: int64(cfg.Limits.MinRequestRate), Version: d.opts.Version,
			Logger:    log.With("server", "resp"),
			OnCommand: m.ObserveRESP, Auth: respAuth(d.users)})
		if err != nil {
			return err
		}
		serve := func(setting, addr string, conf *tls.Config) (string, error) {
			rl, err := net.Listen("tcp", addr)
			if err != nil {
				return "", fmt.Errorf("listen %s %s: %w", setting, addr, err)
			}
			adv := rl.Addr().String() // listen.resp-tls is logged, not advertised
			if conf == nil {
				if adv, err = cfg.AdvertisedAddr(setting, adv); err != nil {
					rl.Close()
					return "", err
				}
			}
			if conf != nil {
				rl = tls.NewListener(rl, conf)
			}
			go func() {
				if err := rs.Serve(rl); err != nil && !errors.Is(err, resp.ErrServerClosed) {
					d.failed <- fmt.Errorf("resp: %w", err)
				}
			}()
			return adv, nil
		}
		undo = append(undo, func() { rs.Close() })
		if cfg.Listen.RESP != "" {
			if addrs.RESP, err = serve("listen.resp", cfg.Listen.RESP, nil); err != nil {
				return err
			}
		}
		if cfg.Listen.RESPTLS != "" {
			if d.respTLS, err = serve("listen.resp-tls", cfg.Listen.RESPTLS, d.sec.serverTLS()); err != nil {
				return err
			}
		}
		m.WatchRESP(func() (map[string]uint64, int) { st := rs.Stats(); return st.Commands, st.ConnectedClients })
		d.stops = append(d.stops, func(ctx context.Context) {
			if err := rs.Shutdown(ctx); err != nil { // commands in flight finish
				log.Warn("resp: shutdown", "err", err)
			}
		})
	}

	// Metrics and health.
	if cfg.Listen.HTTP != "" {
		hl, err := net.Listen("tcp", cfg.Listen.HTTP)
		if err != nil {
			return fmt.Errorf("listen http %s: %w", cfg.Listen.HTTP, err)
		}
		if addrs.HTTP, err = cfg.AdvertisedAddr("listen.http", hl.Addr().String()); err != nil {
			hl.Close()
			return err
		}
		if conf := d.sec.serverTLS(); conf != nil {
			hl = tls.NewListener(hl, conf)
		}
		mux := http.NewServeMux()
		mux.Handle(membership.PlannerDecisionsPath, membership.PlannerHandler(cl))
		mux.Handle("/", m.Handler(cfg.Pprof, d.checks(cl, h)...))
		d.hsrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := d.hsrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.failed <- fmt.Errorf("http: %w", err)
			}
		}()
		undo = append(undo, func() { d.hsrv.Close() })
	}

	// Control plane.
	gopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(m.UnaryInterceptor()), grpc.ChainStreamInterceptor(m.StreamInterceptor()),
		grpc.MaxRecvMsgSize(16 << 20)}
	if d.sec.tls != nil {
		gopts = append(gopts, grpc.Creds(grpctls.Server(d.sec.tls)))
	}
	g := newGRPCServer(gk, gopts...)
	server.Register(g, n, server.Options{Addrs: addrs, Version: d.opts.Version,
		Freshness:  func() *pb.Freshness { return membership.FreshnessToPB(cl.Freshness()) },
		TenantName: d.tenants.name, GPUs: func() []*pb.GPUDevice {
			if gpus == nil {
				return nil
			}
			return gpusToPB(gpus.Snapshot())
		}})
	cl.Register(g)
	if d.keys != nil { // the other nodes' RESP servers read this node's keys
		respcluster.Register(g, d.keys)
	}
	hs := newHealthServer()
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	if err := checkGate(g); err != nil {
		return err
	}
	healthNames := healthServices(g)
	setHealth(hs.Server, healthNames, false) // until ready
	go func() { d.failed <- fmt.Errorf("grpc: %w", g.Serve(glis)) }()
	undo = append(undo, g.Stop)

	if err := cl.Start(raftstore.Member{Name: cfg.Cluster.Name, GRPCAddr: addrs.GRPC, DataAddr: addrs.Data, Transport: cfg.Transport},
		func() []raftstore.TierUsage { return usage(h) }); err != nil {
		return err
	}
	// Ready once the directory lists what the tiers loaded, so that the
	// first lookups answer right; a cluster without quorum gets a while.
	syncCtx, cancelSync := context.WithTimeout(ctx, 10*time.Second)
	if err := cl.Sync(syncCtx); err != nil {
		log.Warn("the directory does not list this node's blocks yet", "err", err)
	}
	cancelSync()
	d.cl, d.h, d.n, d.g, d.hs, d.addrs, d.gpus = cl, h, n, g, hs, addrs, gpus
	d.ready.Store(true)
	setHealth(hs.Server, healthNames, d.Ready() == nil) // right from the moment Start returns
	d.healthDone = make(chan struct{})
	go followHealth(hs.Server, healthNames, func() bool { return d.Ready() == nil }, d.healthDone)
	hst := h.Stats()
	log.Info("kvstrata serving", "version", d.opts.Version, "node", cfg.NodeID, "grpc", addrs.GRPC, "data", addrs.Data,
		"transport", cfg.Transport, "resp", addrs.RESP, "resp-tls", d.respTLS, "http", addrs.HTTP, "raft", cfg.Cluster.RaftAddr,
		"tls", d.sec.tls != nil, "cluster-token", d.sec.cluster != nil,
		"tiers", tierSummary(hst), "blocks", hst.Keys, "startup", time.Since(start).Round(time.Millisecond))
	return nil
}

// Stop shuts the node down: it stops being ready, drains the data plane
// and RESP, stops gRPC gracefully — cutting what is in flight at ctx's
// deadline — then closes HTTP, the tiers and the cluster.
func (d *Node) Stop(ctx context.Context) error {
	d.ready.Store(false)
	close(d.healthDone)
	d.hs.Shutdown()
	cut := context.AfterFunc(ctx, func() {
		d.log.Warn("shutdown timeout: cutting in-flight requests")
		d.g.Stop()
	})
	for i := len(d.stops) - 1; i >= 0; i-- {
		d.stops[i](ctx)
	}
	d.g.GracefulStop()
	cut()
	if d.hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.hsrv.Shutdown(sctx)
		cancel()
	}
	err := d.n.Close()
	if err != nil {
		d.log.Error("closing the tiers", "err", err)
	}
	if d.gpus != nil {
		_ = d.gpus.Close()
	}
	if cerr := d.cl.Close(); cerr != nil {
		d.log.Error("leaving raft", "err", cerr)
		err = errors.Join(err, cerr)
	}
	d.releaseDirs()
	return err
}

// holdDirs holds the directories the node keeps its state in: the data
// directory, and the SSD tier's (ssd.dir) when there is one.
func holdDirs(cfg config.Config) ([]*dirlock.Lock, error) {
	type dir struct{ path, flag string }
	dirs := []dir{{cfg.DataDir, "--data-dir"}}
	if cfg.SSD.Enabled && cfg.SSD.Dir != "" && absPath(cfg.SSD.Dir) != absPath(cfg.DataDir) {
		dirs = append(dirs, dir{cfg.SSD.Dir, "--ssd-dir"})
	}
	var held []*dirlock.Lock
	for _, d := range dirs {
		l, err := dirlock.Acquire(d.path)
		if err != nil {
			for _, h := range held {
				h.Release()
			}
			if errors.Is(err, dirlock.ErrInUse) {
				err = fmt.Errorf("%w: give each node its own %s", err, d.flag)
			}
			return nil, err
		}
		held = append(held, l)
	}
	return held, nil
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return filepath.Clean(p)
}

func (d *Node) releaseDirs() {
	for _, l := range d.dirs {
		_ = l.Release()
	}
}

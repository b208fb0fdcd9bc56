package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/kvstrata/kvstrata/api/cluster"
	"github.com/kvstrata/kvstrata/api/metrics"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/server"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/raftstore"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/ssd"
	"github.com/kvstrata/kvstrata/transfer"
)

func newServeCommand(stdout, stderr io.Writer) *cobra.Command {
	var configPath string
	var printConfig bool
	defaults := config.Default()
	settings := defaults.Settings()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a cache node",
		Long: `serve runs one cache node until SIGINT or SIGTERM, then shuts down
gracefully: it stops accepting, lets in-flight requests finish (up to
--shutdown-timeout) and closes the SSD tier cleanly, so that a restart finds
every block the SSD held.

Every setting can come from, lowest precedence first: its default, the
config file (--config or KVSTRATA_CONFIG, TOML, keys as in --print-config),
an environment variable (KVSTRATA_ and the key in capitals, dots and dashes
as underscores: KVSTRATA_DRAM_CAPACITY) or its flag. --print-config shows the
effective configuration and where each value came from.

Sizes take units: 4096, 64KiB, 4MiB, 8GiB (binary) or 10GB (decimal).`,
		Example: `  # A node with the defaults: DRAM sized from free memory, SSD in ./data
  kvstrata serve

  # 8 GiB of DRAM, a 100 GiB SSD tier on another disk, prefix-aware eviction
  kvstrata serve --dram-capacity 8GiB --ssd-dir /mnt/nvme/kvstrata --ssd-capacity 100GiB --dram-policy prefix

  # See what a config file and the environment add up to
  KVSTRATA_LISTEN_RESP=0.0.0.0:6379 kvstrata serve --config kvstrata.toml --print-config`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("serve takes no arguments, got %q", args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			flags := map[string]string{}
			for _, s := range settings {
				if f := cmd.Flags().Lookup(s.Flag()); f.Changed {
					flags[s.Flag()] = f.Value.String()
				}
			}
			if configPath == "" {
				configPath = os.Getenv("KVSTRATA_CONFIG")
			}
			cfg, err := config.Load(configPath, os.Getenv, flags)
			if err != nil {
				return err
			}
			if err := cfg.Resolve(); err != nil {
				return err // a *config.Error: exit status 2
			}
			if printConfig {
				_, err := io.WriteString(stdout, cfg.Format())
				return err
			}
			return serve(cmd.Context(), cfg, newLogger(cfg.Config, stderr))
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&configPath, "config", "", "TOML config file (default $KVSTRATA_CONFIG)")
	fs.BoolVar(&printConfig, "print-config", false, "print the effective configuration and exit")
	for _, s := range settings {
		fs.String(s.Flag(), s.Value(), s.Usage+" ["+s.Env()+"]")
		if s.Bool {
			fs.Lookup(s.Flag()).NoOptDefVal = "true"
		}
	}
	return cmd
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// openTiers opens the tiers the configuration asks for and stacks them;
// onChange hears every change of their contents.
func openTiers(ctx context.Context, cfg config.Config, log *slog.Logger, onChange func(index.Change)) (*tiers.Hierarchy, error) {
	maxBlock := int64(cfg.Limits.MaxBlockSize)
	d, err := dram.New(dram.Config{Capacity: int64(cfg.DRAM.Capacity), PageSize: int(cfg.DRAM.PageSize), MaxBlockSize: maxBlock})
	if err != nil {
		return nil, err
	}
	dramPolicy, _ := policy.New(cfg.DRAM.Policy) // validated
	levels := []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: d, Policy: dramPolicy,
		HighWatermark: cfg.DRAM.HighWatermark, LowWatermark: cfg.DRAM.LowWatermark}}
	if cfg.SSD.Enabled {
		durability := ssd.DurabilityFlush
		if cfg.SSD.WAL {
			durability = ssd.DurabilityWAL
		}
		s, err := ssd.Open(ssd.Config{Dir: cfg.SSD.Dir, Capacity: int64(cfg.SSD.Capacity), MaxBlockSize: maxBlock,
			Durability: durability, Logger: log.With("tier", "ssd")})
		if err != nil {
			d.Close()
			return nil, err
		}
		ssdPolicy, _ := policy.New(cfg.SSD.Policy)
		levels = append(levels, tiers.LevelConfig{Kind: index.TierSSD, Tier: s, Policy: ssdPolicy,
			HighWatermark: cfg.SSD.HighWatermark, LowWatermark: cfg.SSD.LowWatermark, AdmitMinSeen: cfg.SSD.AdmitMinSeen})
	}
	if c := cfg.S3; c.Endpoint != "" {
		s, err := s3.Open(ctx, s3.Config{Endpoint: c.Endpoint, Bucket: c.Bucket, Prefix: c.Prefix, Region: c.Region,
			Secure: c.Secure, AccessKey: c.AccessKey, SecretKey: c.SecretKey, CreateBucket: c.CreateBucket,
			OpenOffline: !c.RequireAtStart, Capacity: int64(c.Capacity), MaxBlockSize: maxBlock, SegmentSize: int64(c.SegmentSize),
			FlushInterval: c.FlushInterval, MaxPendingBytes: int64(c.MaxPending), Concurrency: c.Concurrency,
			GarbageAge: garbageAge(c.GarbageAge), ProbeTimeout: c.ProbeTimeout, Logger: log.With("tier", "s3")})
		if err != nil {
			for _, l := range levels {
				l.Tier.Close()
			}
			return nil, fmt.Errorf("s3 tier at %s: %w", c.Endpoint, err)
		}
		s3Policy, _ := policy.New(c.Policy)
		into, _ := c.PromoteKinds(cfg.SSD.Enabled) // validated
		levels = append(levels, tiers.LevelConfig{Kind: index.TierS3, Tier: s, Policy: s3Policy, Shared: true, PromoteInto: into})
	}
	h, err := tiers.New(tiers.Config{Node: index.NodeID(cfg.NodeID), Levels: levels, OnChange: onChange})
	if err != nil {
		for _, l := range levels {
			l.Tier.Close()
		}
		return nil, err
	}
	return h, nil
}

// serve runs a node until ctx is done, then shuts it down gracefully.
func serve(ctx context.Context, cfg *config.Loaded, log *slog.Logger) (err error) {
	start := time.Now()
	var undo []func() // closes what is open so far, in reverse, if starting fails
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	// The cluster first: the tiers publish their changes to it from the
	// moment they load.
	cl, err := openCluster(cfg.Config, log)
	if err != nil {
		return err
	}
	undo = append(undo, func() { cl.Close() })
	self := index.NodeID(cfg.NodeID)
	cl.Publish(index.Change{Kind: index.ChangeNodeDropped, Loc: index.Location{Node: self}}) // what a crash left listed
	h, err := openTiers(ctx, cfg.Config, log, cl.Publish)
	if err != nil {
		return err
	}
	n, err := node.New(h, node.Config{MaxBlockSize: int64(cfg.Limits.MaxBlockSize),
		MaxBatchBlocks: cfg.Limits.MaxBatchBlocks, MaxBatchBytes: int64(cfg.Limits.MaxBatchBytes),
		FetchConcurrency: cfg.S3.Concurrency})
	if err != nil {
		h.Close()
		return err
	}
	undo = append(undo, func() { n.Close() })
	n.SetCluster(cl)
	cl.SetUsage(func() []raftstore.TierUsage {
		var out []raftstore.TierUsage
		for _, l := range h.Stats().Levels {
			out = append(out, raftstore.TierUsage{Tier: l.Kind, Capacity: uint64(l.Capacity), Used: uint64(l.Used), Blocks: uint64(l.Blocks)})
		}
		return out
	})
	server.Version = version()
	m := metrics.New(h.Stats, map[string]string{"version": version(), "node_id": fmt.Sprint(cfg.NodeID), "transport": cfg.Transport})
	var ready atomic.Bool
	fail := make(chan error, 4) // a server that stops on its own

	// Control plane.
	glis, err := net.Listen("tcp", cfg.Listen.GRPC)
	if err != nil {
		return fmt.Errorf("listen grpc %s: %w", cfg.Listen.GRPC, err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(m.UnaryInterceptor()), grpc.ChainStreamInterceptor(m.StreamInterceptor()),
		grpc.MaxRecvMsgSize(16<<20))
	server.Register(g, n).SetFreshness(func() *pb.Freshness { return cluster.FreshnessToPB(cl.Freshness()) })
	cl.Register(g)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // until ready
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	go func() { fail <- fmt.Errorf("grpc: %w", g.Serve(glis)) }()
	undo = append(undo, g.Stop)
	addrs := node.Addrs{GRPC: glis.Addr().String(), Transport: cfg.Transport}
	// stops run in reverse order on shutdown, before the gRPC server's
	// graceful stop, with the shutdown's deadline.
	stops := []func(context.Context){}

	// Data plane.
	if cfg.Listen.Data != "" {
		t, err := newTransport(cfg.Config)
		if err != nil {
			return err
		}
		l, err := t.Listen(cfg.Listen.Data, n.DataHandler(func(dir string, bytes int, start time.Time) {
			m.DataBytes(dir, bytes)
			m.Observe("data", map[string]string{"in": "put", "out": "get"}[dir], start)
		}))
		if err != nil {
			return fmt.Errorf("listen data %s: %w", cfg.Listen.Data, err)
		}
		addrs.Data = l.Addr()
		if d, ok := l.(interface{ Describe() string }); ok {
			addrs.TransportDetail = d.Describe
			log.Info("data plane", "transport", cfg.Transport, "detail", d.Describe())
		}
		stops = append(stops, func(ctx context.Context) {
			if d, ok := l.(transfer.Drainer); ok { // let gets and puts in flight finish
				if err := d.Shutdown(ctx); err != nil {
					log.Warn("data plane: requests cut at the shutdown deadline", "err", err)
				}
				return
			}
			l.Close()
		})
		undo = append(undo, func() { l.Close() })
	}

	// Redis protocol.
	if cfg.Listen.RESP != "" {
		maxBulk, pending := max(int64(cfg.Limits.MaxBlockSize)*2, resp.DefaultMaxBulkLen), int64(cfg.Limits.MaxPendingRESPBytes)
		rs, err := resp.NewServer(n.RESPStore(), &resp.Config{MaxClients: cfg.Limits.MaxConnections,
			MaxBulkLen: maxBulk, MaxCommandBytes: max(maxBulk, min(resp.DefaultMaxCommandBytes, pending)),
			MaxPendingBytes: pending, CommandTimeout: cfg.Limits.RequestTimeout,
			MinReadRate: int64(cfg.Limits.MinRequestRate), Version: version(),
			Logger:    log.With("server", "resp"),
			OnCommand: func(name string, start time.Time) { m.Observe("resp", name, start) }})
		if err != nil {
			return err
		}
		rl, err := net.Listen("tcp", cfg.Listen.RESP)
		if err != nil {
			return fmt.Errorf("listen resp %s: %w", cfg.Listen.RESP, err)
		}
		go func() {
			if err := rs.Serve(rl); err != nil && !errors.Is(err, resp.ErrServerClosed) {
				fail <- fmt.Errorf("resp: %w", err)
			}
		}()
		addrs.RESP = rl.Addr().String()
		m.WatchRESP(func() (map[string]uint64, int) { st := rs.Stats(); return st.Commands, st.ConnectedClients })
		stops = append(stops, func(ctx context.Context) {
			if err := rs.Shutdown(ctx); err != nil { // commands in flight finish
				log.Warn("resp: shutdown", "err", err)
			}
		})
		undo = append(undo, func() { rs.Close() })
	}

	// Metrics and health.
	var hsrv *http.Server
	if cfg.Listen.HTTP != "" {
		hl, err := net.Listen("tcp", cfg.Listen.HTTP)
		if err != nil {
			return fmt.Errorf("listen http %s: %w", cfg.Listen.HTTP, err)
		}
		checks := []metrics.Check{{Name: "node", Fn: func() error {
			if !ready.Load() {
				return errors.New("starting or shutting down")
			}
			return nil
		}}, {Name: "cluster", Fn: cl.Ready}}
		for i, kind := range h.Kinds() {
			checks = append(checks, metrics.Check{Name: "tier " + kind.String(), Advisory: true, Fn: func() error {
				l := h.Stats().Levels[i]
				if l.Unavailable != nil {
					return l.Unavailable
				}
				if l.Degraded != nil {
					return fmt.Errorf("degraded: %w", l.Degraded)
				}
				return nil
			}})
		}
		hsrv = &http.Server{Handler: m.Handler(cfg.Pprof, checks...), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hsrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fail <- fmt.Errorf("http: %w", err)
			}
		}()
		addrs.HTTP = hl.Addr().String()
		undo = append(undo, func() { hsrv.Close() })
	}

	n.SetAddrs(addrs)
	if err := cl.Start(raftstore.Member{Name: cfg.Cluster.Name, GRPCAddr: addrs.GRPC, DataAddr: addrs.Data, Transport: cfg.Transport}); err != nil {
		return err
	}
	// Ready once the directory lists what the tiers loaded, so that the
	// first lookups answer right; a cluster without quorum gets a while.
	syncCtx, cancelSync := context.WithTimeout(ctx, 10*time.Second)
	if err := cl.Sync(syncCtx); err != nil {
		log.Warn("the directory does not list this node's blocks yet", "err", err)
	}
	cancelSync()
	ready.Store(true)
	healthDone := make(chan struct{})
	go followHealth(hs, func() bool { return ready.Load() && cl.Ready() == nil }, healthDone)
	hst := h.Stats()
	log.Info("kvstrata serving", "version", version(), "node", cfg.NodeID, "grpc", addrs.GRPC, "data", addrs.Data,
		"transport", cfg.Transport, "resp", addrs.RESP, "http", addrs.HTTP, "raft", cfg.Cluster.RaftAddr,
		"tiers", tierSummary(hst), "blocks", hst.Keys, "startup", time.Since(start).Round(time.Millisecond))

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	case runErr = <-fail:
		log.Error("a server failed; shutting down", "err", runErr)
	}
	ready.Store(false)
	close(healthDone)
	hs.Shutdown()
	deadline := time.AfterFunc(cfg.ShutdownTimeout, func() {
		log.Warn("shutdown timeout: cutting in-flight requests")
		g.Stop()
	})
	stopCtx, cancelStop := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i](stopCtx)
	}
	cancelStop()
	g.GracefulStop()
	deadline.Stop()
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = hsrv.Shutdown(sctx)
		cancel()
	}
	closeErr := n.Close()
	if closeErr != nil {
		log.Error("closing the tiers", "err", closeErr)
	}
	if err := cl.Close(); err != nil {
		log.Error("leaving raft", "err", err)
		closeErr = errors.Join(closeErr, err)
	}
	if closeErr != nil {
		return errors.Join(runErr, closeErr)
	}
	log.Info("stopped")
	return runErr
}

// healthEvery is how often the gRPC health service is brought in line with
// readiness.
const healthEvery = 100 * time.Millisecond

// followHealth sets the gRPC health service's overall status to SERVING
// while ready says so and NOT_SERVING otherwise — the node's readiness
// (/readyz): started, and its replica of the directory current — until
// done is closed.
func followHealth(hs *health.Server, ready func() bool, done <-chan struct{}) {
	t := time.NewTicker(healthEvery)
	defer t.Stop()
	serving := false
	for first := true; ; first = false {
		if r := ready(); first || r != serving {
			serving = r
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if r {
				st = healthpb.HealthCheckResponse_SERVING
			}
			hs.SetServingStatus("", st)
		}
		select {
		case <-t.C:
		case <-done:
			return
		}
	}
}

// openCluster starts the node's raft replica of the block directory.
func openCluster(cfg config.Config, log *slog.Logger) (*cluster.Cluster, error) {
	var peers []raftstore.Peer
	if cfg.Cluster.Bootstrap != "" {
		listed, _ := config.ParsePeers(cfg.Cluster.Bootstrap) // validated
		for _, p := range listed {
			peers = append(peers, raftstore.Peer{ID: index.NodeID(p.ID), RaftAddr: p.RaftAddr})
		}
	}
	skip, _ := config.ParseSkipEntries(cfg.Cluster.SkipEntries) // validated
	name := cfg.Cluster.Name
	if name == "" {
		host, _ := os.Hostname()
		name = fmt.Sprintf("%s-%d", host, cfg.NodeID)
	}
	return cluster.Open(cluster.Config{ID: index.NodeID(cfg.NodeID), Name: name, Dir: filepath.Join(cfg.DataDir, "raft"),
		RaftAddr: cfg.Cluster.RaftAddr, Bootstrap: peers, Join: cfg.Cluster.Join,
		HeartbeatInterval: cfg.Cluster.HeartbeatInterval, LivenessTimeout: cfg.Cluster.LivenessTimeout,
		SkipEntries: skip, Logger: log.With("component", "cluster")})
}

func tierSummary(s tiers.HierarchyStats) string {
	var parts []string
	for _, l := range s.Levels {
		parts = append(parts, fmt.Sprintf("%s %s/%s (%s)", l.Kind, units.FormatBytes(l.Used), units.FormatBytes(l.Capacity), l.Policy))
	}
	return strings.Join(parts, ", ")
}

// newTransport builds the configured data-plane transport.
func newTransport(cfg config.Config) (transfer.Transport, error) {
	build, ok := transports[cfg.Transport]
	if !ok {
		return nil, fmt.Errorf("transport %q is not built into this binary", cfg.Transport)
	}
	return build(cfg)
}

// garbageAge maps s3.garbage-age (0: never) to s3.Config.GarbageAge
// (negative: never).
func garbageAge(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

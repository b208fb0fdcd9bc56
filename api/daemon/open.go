package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/kvstrata/kvstrata/api/membership"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/raftstore"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/s3"
	"github.com/kvstrata/kvstrata/tiers/ssd"
)

// openCluster starts the node's raft replica of the block directory.
func openCluster(cfg config.Config, log *slog.Logger, sec *security, dialOpts []grpc.DialOption) (*membership.Agent, error) {
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
	advertise, err := cfg.AdvertisedAddr("cluster.raft-addr", "")
	if err != nil {
		return nil, err
	}
	return membership.Open(membership.Config{ID: index.NodeID(cfg.NodeID), Name: name, Dir: filepath.Join(cfg.DataDir, "raft"),
		RaftAddr: cfg.Cluster.RaftAddr, RaftAdvertise: advertise, Bootstrap: peers, Join: cfg.Cluster.Join,
		HeartbeatInterval: cfg.Cluster.HeartbeatInterval, LivenessTimeout: cfg.Cluster.LivenessTimeout,
		ReconcileInterval: reconcileInterval(cfg.Cluster.ReconcileInterval), SkipEntries: skip,
		RaftGuard: sec.raftGuard(), DialCredentials: sec.peerCredentials(), DialOptions: dialOpts, Logger: log.With("component", "cluster")})
}

// openTiers opens the tiers the configuration asks for and stacks them;
// onChange hears every change of their contents. openHBM opens the
// GPU-memory tier when there is one.
func openTiers(ctx context.Context, cfg config.Config, log *slog.Logger,
	openHBM func(config.HBM, int64) (tiers.Tier, error), onChange func(index.Change)) (*tiers.Hierarchy, error) {
	maxBlock := int64(cfg.Limits.MaxBlockSize)
	var levels []tiers.LevelConfig
	if cfg.HBM.Capacity > 0 {
		t, err := openHBM(cfg.HBM, maxBlock)
		if err != nil {
			return nil, fmt.Errorf("hbm tier on GPU %d: %w", cfg.HBM.Device, err)
		}
		if fr, ok := t.(interface{ FileReads() (string, string) }); ok {
			args := []any{"gds", cfg.HBM.GDS}
			mode, why := fr.FileReads()
			if args = append(args, "reads", mode); why != "" {
				args = append(args, "cufile", why)
			}
			log.Info("hbm tier: how blocks promoted out of SSD files reach device memory", args...)
		}
		p, _ := policy.New(cfg.HBM.Policy) // validated
		levels = append(levels, tiers.LevelConfig{Kind: index.TierHBM, Tier: t, Policy: p,
			HighWatermark: cfg.HBM.HighWatermark, LowWatermark: cfg.HBM.LowWatermark})
	}
	d, err := dram.New(dram.Config{Capacity: int64(cfg.DRAM.Capacity), PageSize: int(cfg.DRAM.PageSize), MaxBlockSize: maxBlock})
	if err != nil {
		for _, l := range levels {
			l.Tier.Close()
		}
		return nil, err
	}
	dramPolicy, _ := policy.New(cfg.DRAM.Policy) // validated
	levels = append(levels, tiers.LevelConfig{Kind: index.TierDRAM, Tier: d, Policy: dramPolicy,
		HighWatermark: cfg.DRAM.HighWatermark, LowWatermark: cfg.DRAM.LowWatermark})
	if cfg.SSD.Enabled {
		durability := ssd.DurabilityFlush
		if cfg.SSD.WAL {
			durability = ssd.DurabilityWAL
		}
		s, err := ssd.Open(ssd.Config{Dir: cfg.SSD.Dir, Capacity: int64(cfg.SSD.Capacity), MaxBlockSize: maxBlock,
			FileMinSize: int64(cfg.SSD.FileMinSize), OpenFiles: noneIfZero(cfg.SSD.OpenFiles),
			RecordCache: noneIfZero(cfg.SSD.RecordCache), ReadAhead: int64(cfg.SSD.ReadAhead),
			Durability: durability, Logger: log.With("tier", "ssd")})
		if err != nil {
			for _, l := range levels {
				l.Tier.Close()
			}
			return nil, err
		}
		ssdPolicy, _ := policy.New(cfg.SSD.Policy)
		levels = append(levels, tiers.LevelConfig{Kind: index.TierSSD, Tier: s, Policy: ssdPolicy,
			HighWatermark: cfg.SSD.HighWatermark, LowWatermark: cfg.SSD.LowWatermark, AdmitMinSeen: cfg.SSD.AdmitMinSeen,
			AdmitByFrequency: cfg.SSD.AdmitByFrequency})
	}
	if c := cfg.S3; c.Endpoint != "" {
		s, err := s3.Open(ctx, s3.Config{Endpoint: c.Endpoint, Bucket: c.Bucket, Prefix: c.Prefix, Region: c.Region,
			Secure: c.Secure, AccessKey: c.AccessKey, SecretKey: c.SecretKey, CreateBucket: c.CreateBucket,
			OpenOffline: !c.RequireAtStart, Capacity: int64(c.Capacity), MaxBlockSize: maxBlock, SegmentSize: int64(c.SegmentSize),
			FlushInterval: c.FlushInterval, MaxPendingBytes: int64(c.MaxPending), Concurrency: c.Concurrency,
			ReadBuffers: readBuffers(cfg), GarbageAge: garbageAge(c.GarbageAge), ProbeTimeout: c.ProbeTimeout, Logger: log.With("tier", "s3")})
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
	// With authentication every namespace is bound to its tenant: the
	// tiers count each tenant's blocks and enforce its quotas.
	h, err := tiers.New(tiers.Config{Node: index.NodeID(cfg.NodeID), Levels: levels, OnChange: onChange,
		Tenants: cfg.Auth.UsersFile != ""})
	if err != nil {
		for _, l := range levels {
			l.Tier.Close()
		}
		return nil, err
	}
	return h, nil
}

// usage is the node's tier usage, for the cluster's heartbeats.
func usage(h *tiers.Hierarchy) []raftstore.TierUsage {
	var out []raftstore.TierUsage
	for _, l := range h.Stats().Levels {
		out = append(out, raftstore.TierUsage{Tier: l.Kind, Capacity: uint64(l.Capacity), Used: uint64(l.Used), Blocks: uint64(l.Blocks)})
	}
	return out
}

func tierSummary(s tiers.HierarchyStats) string {
	var parts []string
	for _, l := range s.Levels {
		parts = append(parts, fmt.Sprintf("%s %s/%s (%s)", l.Kind, units.FormatBytes(l.Used), units.FormatBytes(l.Capacity), l.Policy))
	}
	return strings.Join(parts, ", ")
}

// reconcileInterval maps cluster.reconcile-interval (0: off) to
// membership.Config.ReconcileInterval (negative: off).
func reconcileInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// garbageAge maps s3.garbage-age (0: never) to s3.Config.GarbageAge
// (negative: never).
func garbageAge(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// noneIfZero is ssd.Config.OpenFiles or RecordCache for the setting
// ssd.open-files or ssd.record-cache, whose 0 keeps none: -1 in the
// tier's Config, where 0 is the default.
func noneIfZero(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// readBuffers is how many bytes of read buffers the object store's tier
// keeps for reuse: a segment for each read a restore keeps in flight
// (fetch-concurrency/4), and at least four. With fewer, a deeper read
// ahead lets buffers go at the end of every restore, and the next one maps
// fresh memory for them.
func readBuffers(cfg config.Config) int64 {
	return int64(max(4, cfg.FetchConcurrency/4)) * int64(cfg.S3.SegmentSize)
}

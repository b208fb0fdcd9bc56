package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/internal/tlsfiles"
	"github.com/kvstrata/kvstrata/tiers"
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
every block the SSD held. SIGHUP reads the TLS certificate, key and CA
files (and the cluster token) again: new connections get the new ones,
open connections keep theirs.

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
  KVSTRATA_LISTEN_RESP=0.0.0.0:6379 kvstrata serve --config kvstrata.toml --advertise-host cache1.example.com --print-config`,
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

// serve runs a cache node until ctx is done, then shuts it down gracefully.
func serve(ctx context.Context, cfg *config.Loaded, log *slog.Logger) error {
	files, err := daemon.LoadTLS(cfg.Config)
	if err != nil {
		return err
	}
	var t transfer.Transport
	if cfg.Listen.Data != "" {
		if t, err = newTransport(cfg.Config, files); err != nil {
			return err
		}
	}
	n, err := daemon.New(cfg.Config, daemon.Options{Logger: log, Version: version(), Transport: t, TLS: files, HBM: openHBM})
	if err != nil {
		return err
	}
	r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: cfg.ShutdownTimeout, Logger: log, Reload: reloadSignals}, n)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// openHBM opens the GPU-memory tier; nil in binaries built without the
// cuda tag (hbm_cuda.go).
var openHBM func(config.HBM, int64) (tiers.Tier, error)

// newTransport builds the configured data-plane transport, over TLS with
// files when they are given (the tcp transport; ucx is for trusted
// networks only).
func newTransport(cfg config.Config, files *tlsfiles.Files) (transfer.Transport, error) {
	build, ok := transports[cfg.Transport]
	if !ok {
		return nil, fmt.Errorf("transport %q is not built into this binary", cfg.Transport)
	}
	return build(cfg, files)
}

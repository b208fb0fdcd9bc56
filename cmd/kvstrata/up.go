package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/router/frontend"
	"github.com/kvstrata/kvstrata/transfer"
)

// upNodeFlags are serve's settings that `up` offers for its cache node,
// under serve's flag names.
var upNodeFlags = []string{"data-dir", "dram-capacity", "ssd-capacity", "listen-grpc", "listen-data", "listen-resp",
	"listen-http", "cluster-raft-addr", "log-level", "log-format", "shutdown-timeout"}

func newUpCommand(stderr io.Writer) *cobra.Command {
	tmpl := worker.DefaultConfig()
	var t flagTable
	var n struct{ workers, prefill, decode, httpPort, eventsPort int }
	var host, configPath, frontendListen string
	var pl upPlannerFlags
	nodeDefaults := config.Default()
	settings := nodeDefaults.Settings()
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole single-machine deployment in one process: a cache node, N workers and the frontend",
		Long: `up runs, in one process, a kvstrata cache node, --workers inference workers
(as ` + "`kvstrata worker`" + ` runs them) that use it, and the frontend in front of
them on --frontend (127.0.0.1:8080), until SIGINT or SIGTERM; then it stops
the frontend and the workers (requests in flight finish, up to
--shutdown-timeout) and the cache node last.

Workers are aggregated, or with --prefill N --decode M a disaggregated set of
N prefill and M decode workers (in that order). Worker i (from 0) listens on
--host:--http-port+i for HTTP and, unless --kv-events-port is 0, publishes
its KV events on tcp://--host:--kv-events-port+2i with its replay socket on
the port after. Each part logs one line saying where it listens.

The frontend (as ` + "`kvstrata frontend`" + ` runs it, with its defaults) serves the
OpenAI API on --frontend and routes every request to the worker that serves
it best, by the workers' KV events and the cache node's tiers. In front of a
disaggregated set it serves disaggregated: each long prompt is prefilled on a
prefill worker and decoded on the least loaded decode worker, a short one
(at most 1000 uncached tokens) prefilled on the decode worker itself.
--frontend "" runs none.

The cache node takes serve's settings from its defaults, --config, the
KVSTRATA_ environment variables and the flags below; its data lives in
--data-dir (default ./data, as serve's), so a restart finds what its SSD
tier held.

` + plannerUsage,
		Example: `  # A cache node, one sim worker and the frontend; then stream a completion through it
  kvstrata up
  curl -sN 127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \
    -d '{"model": "kvstrata-sim", "prompt": "Hello", "max_tokens": 8, "stream": true}'

  # Four tiny-transformer workers on 8000-8003, data in a scratch directory
  kvstrata up --model tiny --workers 4 --data-dir /tmp/kvstrata

  # Two workers behind a frontend on :8081, one request routed round-robin
  kvstrata up --workers 2 --frontend 127.0.0.1:8081
  curl -sN 127.0.0.1:8081/v1/completions -H 'Content-Type: application/json' \
    -d '{"model": "kvstrata-sim", "prompt": "Hello", "max_tokens": 8, "stream": true, "kvstrata": {"policy": "round-robin"}}'

  # A disaggregated set: prefill workers on 8000-8001, decode workers on 8002-8004,
  # the frontend on :8080 in front of them
  kvstrata up --prefill 2 --decode 3

  # One to three workers, sized by the planner for a 2s TTFT and a 50ms ITL
  kvstrata up --planner profile.json --slo-ttft 2s --slo-itl 50ms --min-workers 1 --max-workers 3
  curl -s 127.0.0.1:8090/v1/planner/status`,
		Args: noArgs("up"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			probs := t.apply()
			flags := map[string]string{}
			for _, name := range upNodeFlags {
				if f := cmd.Flags().Lookup(name); f.Changed {
					flags[name] = f.Value.String()
				}
			}
			if configPath == "" {
				configPath = os.Getenv("KVSTRATA_CONFIG")
			}
			node, err := config.Load(configPath, os.Getenv, flags)
			var ce *config.Error
			switch {
			case errors.As(err, &ce):
				probs = append(probs, ce.Problems...)
			case err != nil:
				return err
			}
			pl.changed = func(name string) bool { return cmd.Flags().Lookup(name).Changed }
			probs = append(probs, pl.check(n.workers, n.prefill > 0 || n.decode > 0, frontendListen)...)
			workers := n.workers
			if pl.profile != "" {
				workers = pl.initialWorkers(n.workers)
			}
			roles, rp := upRoles(cmd, workers, n.prefill, n.decode)
			probs = append(probs, rp...)
			if len(roles) > 0 {
				probs = append(probs, checkPorts("--http-port", n.httpPort, len(roles), 1)...)
				if n.eventsPort != 0 {
					probs = append(probs, checkPorts("--kv-events-port", n.eventsPort, len(roles), 2)...)
				}
			}
			cache := tmpl.Cache
			if node != nil {
				cache = node.Listen.GRPC
			}
			var cfgs []worker.Config
			for i, role := range roles {
				c := tmpl
				c.Role, c.Cache = role, cache
				c.Listen = net.JoinHostPort(host, strconv.Itoa(n.httpPort+i))
				c.KVEvents, c.KVEventsReplay = "", "" // --kv-events-port 0: no events
				if n.eventsPort != 0 {
					c.KVEvents = "tcp://" + net.JoinHostPort(host, strconv.Itoa(n.eventsPort+2*i))
					c.KVEventsReplay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(n.eventsPort+2*i+1))
				}
				c.EnsureDefaults()
				if err := c.Validate(); err != nil {
					// Every worker has the same settings but its role and
					// ports: one report says it all.
					probs = append(probs, configProblems(err)...)
					break
				}
				cfgs = append(cfgs, c)
			}
			if len(probs) > 0 {
				return usageError{fmt.Errorf("bad flags:\n  %s", strings.Join(probs, "\n  "))}
			}
			if err := node.Resolve(); err != nil {
				return err
			}
			log := newLogger(node.Config, stderr)
			var parts []lifecycle.Part
			if pl.profile != "" {
				for i := range cfgs {
					cfgs[i].Logger = log
				}
				fe, err := upFrontend(frontendListen, cache, cfgs, log)
				if err != nil {
					return usageError{err}
				}
				pool, pp, err := upPlanner(&pl, cfgs, tmpl, host, n.eventsPort != 0, fe, log)
				if err != nil {
					return usageError{err}
				}
				parts = append(parts, pool, fe, pp)
			}
			for _, c := range cfgs {
				if pl.profile != "" {
					break // the planner's workers are started above
				}
				c.Logger = log
				w, err := worker.New(c)
				if err != nil {
					return usageError{err}
				}
				parts = append(parts, w)
			}
			if frontendListen != "" && pl.profile == "" {
				fe, err := upFrontend(frontendListen, cache, cfgs, log)
				if err != nil {
					return usageError{err}
				}
				parts = append(parts, fe)
			}
			files, err := daemon.LoadTLS(node.Config)
			if err != nil {
				return err
			}
			var tr transfer.Transport
			if node.Listen.Data != "" {
				if tr, err = newTransport(node.Config, files); err != nil {
					return err
				}
			}
			d, err := daemon.New(node.Config, daemon.Options{Logger: log, Version: version(), Transport: tr, TLS: files, HBM: openHBM})
			if err != nil {
				return err
			}
			// The cache node first, so that it is up when the workers dial
			// it, and stopped last.
			r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: node.ShutdownTimeout, Logger: log, Reload: reloadSignals}, append([]lifecycle.Part{d}, parts...)...)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	t.fs = fs
	t.int("workers", 1, "how many aggregated workers to run", &n.workers)
	t.int("prefill", 0, "how many prefill workers to run (with --decode: a disaggregated set instead of --workers)", &n.prefill)
	t.int("decode", 0, "how many decode workers to run (with --prefill)", &n.decode)
	t.str("host", "127.0.0.1", "address the workers' HTTP and KV-event sockets listen on", &host)
	t.int("http-port", 8000, "HTTP port of worker 0; worker i listens on this + i", &n.httpPort)
	t.int("kv-events-port", 5557, "KV-event PUB port of worker 0; worker i publishes on this + 2i, its replay socket on the port after (0: no events)", &n.eventsPort)
	t.str("frontend", DefaultFrontendListen, `HTTP address of the frontend, the OpenAI API routing to the workers ("": none)`, &frontendListen)
	addModelFlags(&t, &tmpl)
	addUpPlannerFlags(&t, &pl)
	fs.StringVar(&configPath, "config", "", "the cache node's TOML config file, as serve's (default $KVSTRATA_CONFIG)")
	for _, s := range settings {
		if slices.Contains(upNodeFlags, s.Flag()) {
			who := "cache node: "
			if slices.Contains([]string{"log-level", "log-format", "shutdown-timeout"}, s.Flag()) {
				who = "every part: "
			}
			fs.String(s.Flag(), s.Value(), who+s.Usage+" ["+s.Env()+"]")
		}
	}
	return cmd
}

// upRoles is the role of each worker `up` runs, from --workers, --prefill
// and --decode, and what is wrong with them.
func upRoles(cmd *cobra.Command, workers, prefill, decode int) ([]string, []string) {
	var probs []string
	for _, f := range []struct {
		name string
		v    int
	}{{"workers", workers}, {"prefill", prefill}, {"decode", decode}} {
		if f.v < 0 || f.v > 1000 {
			probs = append(probs, fmt.Sprintf("--%s %d: must be in [0, 1000]", f.name, f.v))
		}
	}
	if len(probs) > 0 {
		return nil, probs
	}
	if prefill == 0 && decode == 0 {
		if workers == 0 {
			return nil, []string{"--workers 0: run at least one worker"}
		}
		return slices.Repeat([]string{worker.RoleAggregated}, workers), nil
	}
	if prefill == 0 || decode == 0 {
		probs = append(probs, fmt.Sprintf("--prefill %d --decode %d: a disaggregated set needs both", prefill, decode))
	}
	if cmd.Flags().Lookup("workers").Changed {
		probs = append(probs, "--workers with --prefill/--decode: give either the aggregated count or the disaggregated one")
	}
	if len(probs) > 0 {
		return nil, probs
	}
	return append(slices.Repeat([]string{worker.RolePrefill}, prefill), slices.Repeat([]string{worker.RoleDecode}, decode)...), nil
}

// checkPorts checks that n workers, each taking per ports from base on,
// fit the port range.
func checkPorts(flag string, base, n, per int) []string {
	if base < 1 || base+n*per-1 > 65535 {
		return []string{fmt.Sprintf("%s %d: %d workers need ports %d to %d, outside [1, 65535]", flag, base, n, base, base+n*per-1)}
	}
	return nil
}

// upFrontend is the frontend `up --frontend` runs in front of its workers:
// started after them, stopped before.
func upFrontend(listen, cache string, workers []worker.Config, log *slog.Logger) (*frontendPart, error) {
	ns, err := worker.Namespace(workers[0])
	if err != nil {
		return nil, err
	}
	cfg := frontend.Config{Namespace: ns, Cache: cache, WorkerBlocks: workers[0].Blocks, Logger: log}
	if path := workers[0].SimProfile; path != "" {
		// The workers' prefill curve gives the router's recompute times.
		p, err := sim.ReadProfile(path)
		if err != nil {
			return nil, err
		}
		cfg.Policy.Profile = &p
	}
	for _, w := range workers {
		cfg.Workers = append(cfg.Workers, frontend.WorkerSpec{URL: "http://" + w.Listen, Events: w.KVEvents, Replay: w.KVEventsReplay, Role: w.Role})
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &frontendPart{cfg: cfg, model: workers[0], listen: listen, failed: make(chan error, 1)}, nil
}

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"

	"github.com/kvstrata/kvstrata/replay/simulate"
	"github.com/kvstrata/kvstrata/router/policy"
	"github.com/kvstrata/kvstrata/trace"
)

// simulateFlags are the flags of kvctl replay --simulate, as typed.
type simulateFlags struct {
	workers     int
	parallel    int
	routers     string
	baselines   string
	poolTokens  int
	tokenBytes  int64
	cachePolicy string
	capacity    [3]int64         // dram, ssd, s3 tokens
	gbps        [3]float64       // dram, ssd, s3 GB/s
	latency     [3]time.Duration // dram, ssd, s3
	// sc are the flags of the scalers, the SLO and the worker limits.
	sc scalerFlags
	// given lists the simulation-only flags set on the command line.
	given []string
}

// simulateOnly are the flags that mean something only with --simulate.
var simulateOnly = []string{"workers", "parallel", "router", "baseline", "pool-tokens", "token-bytes", "cache-policy",
	"dram-tokens", "ssd-tokens", "s3-tokens", "dram-gbps", "ssd-gbps", "s3-gbps", "dram-latency", "ssd-latency", "s3-latency"}

func init() { simulateOnly = append(simulateOnly, scalerOnly...) }

func (s *simulateFlags) register(fl *pflag.FlagSet) {
	def := simulate.DefaultTiers()
	fl.IntVar(&s.workers, "workers", simulate.DefaultWorkers, "--simulate: simulated workers")
	fl.IntVar(&s.parallel, "parallel", 1, "--simulate: policies simulated at once (each needs its own memory)")
	fl.StringVar(&s.routers, "router", "random,round-robin,least-loaded,kv-hbm,kv-tiered",
		"--simulate: routing policies to compare, comma-separated: "+policyNames())
	fl.StringVar(&s.baselines, "baseline", "",
		"--simulate: routing policies also replayed without kvstrata's cache (no offload, no onboarding, no tiers for the router), comma-separated; rows with cache \"none\"")
	fl.IntVar(&s.poolTokens, "pool-tokens", simulate.DefaultPoolTokens, "--simulate: each worker's GPU KV pool, in tokens (also its context length)")
	fl.Int64Var(&s.tokenBytes, "token-bytes", simulate.DefaultTokenBytes, "--simulate: modelled KV bytes of one token, all layers (131072: Llama-3.1-8B in fp16)")
	fl.StringVar(&s.cachePolicy, "cache-policy", "", "--simulate: every cache tier's eviction policy (default: the node's, s3fifo for DRAM, lru for SSD and S3)")
	for i, t := range []struct {
		name   string
		tokens int64
		what   string
	}{{"dram", simulate.DefaultDRAMTokens, "1 TiB at 128 KiB a token"}, {"ssd", simulate.DefaultSSDTokens, "8 TiB"}, {"s3", simulate.DefaultS3Tokens, "unbounded"}} {
		fl.Int64Var(&s.capacity[i], t.name+"-tokens", t.tokens, fmt.Sprintf("--simulate: the cache's %s capacity in tokens, cluster-wide (%s)", t.name, t.what))
		fl.Float64Var(&s.gbps[i], t.name+"-gbps", def[i].Bandwidth/1e9, fmt.Sprintf("--simulate: restore bandwidth from %s into a worker, GB/s", t.name))
		fl.DurationVar(&s.latency[i], t.name+"-latency", def[i].Latency, fmt.Sprintf("--simulate: latency of a run of blocks restored from %s", t.name))
	}
	s.sc.register(fl)
}

func policyNames() string {
	var names []string
	for _, p := range policy.Policies() {
		names = append(names, p.String())
	}
	return strings.Join(names, ", ")
}

// config is the simulation's Config, or every problem of the flags.
func (s simulateFlags) config(f replayFlags) (simulate.Config, []string) {
	var probs []string
	cfg := simulate.Config{
		Workers: s.workers, Parallel: s.parallel, Speedup: f.speedup, Seed: f.seed, Vocab: f.vocab,
		PoolTokens: s.poolTokens, TokenBytes: s.tokenBytes, CachePolicy: s.cachePolicy,
		DRAMTokens: s.capacity[0], SSDTokens: s.capacity[1], S3Tokens: s.capacity[2],
	}
	for _, name := range strings.Split(s.routers, ",") {
		p, err := policy.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			probs = append(probs, fmt.Sprintf("--router: %q is not a policy (want %s)", name, policyNames()))
			continue
		}
		cfg.Policies = append(cfg.Policies, p)
	}
	if s.baselines != "" {
		for _, name := range strings.Split(s.baselines, ",") {
			p, err := policy.ParsePolicy(strings.TrimSpace(name))
			if err != nil {
				probs = append(probs, fmt.Sprintf("--baseline: %q is not a policy (want %s)", name, policyNames()))
				continue
			}
			cfg.Baselines = append(cfg.Baselines, p)
		}
	}
	if f.target != "" {
		probs = append(probs, "--target and --simulate exclude each other")
	}
	if s.workers < 1 {
		probs = append(probs, fmt.Sprintf("--workers is %d, must be ≥ 1", s.workers))
	}
	if s.parallel < 1 {
		probs = append(probs, fmt.Sprintf("--parallel is %d, must be ≥ 1", s.parallel))
	}
	if s.poolTokens < 1 {
		probs = append(probs, fmt.Sprintf("--pool-tokens is %d, must be ≥ 1", s.poolTokens))
	}
	if s.tokenBytes < 1 {
		probs = append(probs, fmt.Sprintf("--token-bytes is %d, must be ≥ 1", s.tokenBytes))
	}
	for i, name := range []string{"dram", "ssd", "s3"} {
		if s.capacity[i] < 1 {
			probs = append(probs, fmt.Sprintf("--%s-tokens is %d, must be ≥ 1", name, s.capacity[i]))
		}
		if !(s.gbps[i] > 0) {
			probs = append(probs, fmt.Sprintf("--%s-gbps is %v, must be > 0", name, s.gbps[i]))
		}
		if s.latency[i] < 0 {
			probs = append(probs, fmt.Sprintf("--%s-latency is %v, must be ≥ 0", name, s.latency[i]))
		}
		// A zero latency is taken as "none", not as the default.
		cfg.Tiers[i] = simulate.TierModel{Bandwidth: s.gbps[i] * 1e9, Latency: max(s.latency[i], time.Nanosecond)}
	}
	probs = append(probs, s.sc.apply(&cfg)...)
	return cfg, probs
}

func (a *app) runSimulate(ctx context.Context, path string, f replayFlags, cfg simulate.Config) error {
	all, err := trace.ReadFile(path)
	if err != nil {
		return err
	}
	reqs := f.cut(all)
	if len(reqs) == 0 {
		return fmt.Errorf("replay: %s has no request to replay (%d in the file)", path, len(all))
	}
	var sz *sizing
	if names := f.sim.sc.names(); len(names) > 0 {
		m, err := perfModel(cfg)
		if err != nil {
			return usageErrorf("replay: --planner-profile: %v", err)
		}
		if probs := f.sim.sc.check(cfg, m); len(probs) > 0 {
			return usageErrorf("replay: %s", strings.Join(probs, "; "))
		}
		s := f.sim.sc.size(reqs, cfg, m)
		sz = &s
		cfg.Scalers = f.sim.sc.scalers(cfg, s, m)
	}
	var bar *progressbar.ProgressBar
	if a.interactive(a.stderr) {
		runs := (len(cfg.Policies) + len(cfg.Baselines)) * max(len(cfg.Scalers), 1)
		bar = progressbar.NewOptions(len(reqs)*runs, progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription(fmt.Sprintf("simulating %d runs", runs)),
			progressbar.OptionShowCount(), progressbar.OptionSetItsString("requests"), progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		cfg.Progress = func(policy.Policy, int, int) { _ = bar.Add(1) } // Run serializes the calls
	}
	start := time.Now()
	rows, err := simulate.Run(ctx, reqs, cfg)
	if bar != nil {
		_ = bar.Exit()
	}
	if err == nil && sz != nil {
		rows, err = f.sim.sc.raisePeak(ctx, reqs, cfg, rows, a.stderr)
	}
	if err != nil && len(rows) == 0 {
		return fmt.Errorf("%s: %w", path, err)
	}
	if a.output == outputJSON {
		if werr := writeJSON(a.stdout, rows); werr != nil {
			return werr
		}
	} else {
		writeSimulateTable(a, filepath.Base(path), len(reqs), cfg, rows, time.Since(start))
	}
	if sz != nil {
		w := a.stdout
		if a.output == outputJSON {
			w = a.stderr
		}
		writeSizing(w, *sz, f.sim.sc)
	}
	if err != nil {
		return fmt.Errorf("replay --simulate stopped after %d of %d runs: %w", len(rows), (len(cfg.Policies)+len(cfg.Baselines))*max(len(cfg.Scalers), 1), err)
	}
	for _, r := range rows {
		if r.Failed > 0 {
			return fmt.Errorf("replay --simulate: %s (cache %s): %d of %d requests failed; first: %s", r.Router, r.Cache, r.Failed, r.Requests, r.FirstError)
		}
	}
	return nil
}

// writeSimulateTable writes the rows for people: one line per policy.
func writeSimulateTable(a *app, name string, n int, cfg simulate.Config, rows []simulate.Row, wall time.Duration) {
	w := a.stdout
	if len(cfg.Scalers) > 0 {
		writeScalerTable(a, name, n, cfg, rows, wall)
		return
	}
	fmt.Fprintf(w, "%s: %d requests at speedup %g on %d simulated workers (pools of %d tokens), in virtual time; %s of wall time\n\n",
		name, n, cfg.Speedup, cfg.Workers, cfg.PoolTokens, wall.Round(time.Millisecond))
	s := func(v float64) string { return formatLatency(time.Duration(v * float64(time.Second))) }
	var table [][]string
	for _, r := range rows {
		hit := func(tier string) string {
			if r.PromptTokens == 0 {
				return "-"
			}
			return percent(float64(r.HitTokensByTier[tier]) / float64(r.PromptTokens))
		}
		table = append(table, []string{r.Router, r.Cache, s(r.TTFTMeanS), s(r.TTFTP99S), s(r.ITLMeanS), s(r.E2EMeanS),
			hit("hbm"), hit("dram"), hit("ssd"), hit("s3"), fmt.Sprint(r.QueuedRequests), fmt.Sprint(r.Failed)})
	}
	_ = writeTable(w, []string{"ROUTER", "CACHE", "TTFT MEAN", "TTFT P99", "ITL MEAN", "E2E MEAN", "HIT HBM", "DRAM", "SSD", "S3", "QUEUED", "FAILED"}, table)
	fmt.Fprintf(w, "\nhits are shares of prompt tokens not computed, by where they were found; queued requests waited for a worker that was not busy; cache none: workers without kvstrata (no offload, no onboarding)\n")
}

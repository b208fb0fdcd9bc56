package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/loadgen"
)

// benchNamespace is the namespace bench stores its blocks in unless told
// another: kvctl evict --namespace with it removes them.
var benchNamespace = index.NamespaceID(xxhash.Sum64String("kvctl-bench"))

// benchFlags are the flags of kvctl bench, as typed.
type benchFlags struct {
	target      string
	op          string
	getRatio    float64
	size        string
	keys        int
	batch       int
	concurrency int
	duration    time.Duration
	requests    int64
	namespace   string
	grpc        bool
	noPopulate  bool
}

func (a *app) newBenchCommand() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Load a node (or a Redis server) with puts, gets or lookups and measure it",
		Long: `bench drives a target with --concurrency workers, each with one request in
flight, for --duration or --requests, and reports requests, values moved
(OPS), bytes, throughput (MB/s and GB/s are 10^6 and 10^9 bytes a second)
and the latency of a request (p50, p99, p99.9, max).

Targets:
  kvstrata://HOST:PORT  a kvstrata node at its gRPC address (default: --addr);
                        block bytes travel over its data plane, or over gRPC
                        with --grpc
  redis://HOST:PORT     a Redis server (or anything speaking RESP2), through
                        kvctl's own minimal client: SET and GET, one key a
                        request

Operations (--op):
  put     store values, the working set's keys in turn
  get     read values back (random keys of the working set)
  lookup  longest-prefix lookups of --batch consecutive keys (kvstrata only)
  mixed   gets and puts at random, --get-ratio of them gets

Get, lookup and mixed runs first put the whole working set (--keys values);
that populate phase is reported on a line of its own. Every value is
deterministic per key, and every get compares the bytes it read with it: a
wrong value counts as an error, a key not found (evicted) as a miss. Errors
make the exit status 1.

A progress bar is drawn on stderr when it is a terminal. The blocks stay on
the node afterwards: kvctl evict --namespace NS --yes removes them (the
default namespace is ` + benchNamespace.String() + `).`,
		Example: `  # 1 MiB gets from the local node for 10 s over the data plane
  kvctl bench --op get --size 1MiB

  # The same over gRPC, and against redis-server
  kvctl bench --op get --size 1MiB --grpc
  kvctl bench --op get --size 1MiB --target redis://127.0.0.1:6379

  # 10,000 puts of 16 blocks of 256 KiB, as JSON
  kvctl bench --op put --size 256KiB --batch 16 --requests 10000 -o json

  # 90% gets over 4,096 keys of 64 KiB, 32 workers, 30 s
  kvctl bench --op mixed --get-ratio 0.9 --size 64KiB --keys 4096 --concurrency 32 --duration 30s`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("bench takes flags only, got %q", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runBench(cmd.Context(), f, cmd.Flags().Changed)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.target, "target", "", "kvstrata://HOST:PORT or redis://HOST:PORT (default kvstrata://<--addr>)")
	fl.StringVar(&f.op, "op", "get", "put, get, lookup or mixed")
	fl.Float64Var(&f.getRatio, "get-ratio", 0.9, "--op mixed: the share of requests that are gets")
	fl.StringVar(&f.size, "size", "1MiB", "size of each value: 4096, 64KiB, 1MiB")
	fl.IntVar(&f.keys, "keys", 0, "working set in keys (0: as many as 256 MiB of values make, 16 to 16384)")
	fl.IntVar(&f.batch, "batch", 1, "keys per request (kvstrata; Redis takes 1)")
	fl.IntVarP(&f.concurrency, "concurrency", "c", 8, "workers, each with one request in flight")
	fl.DurationVarP(&f.duration, "duration", "d", 10*time.Second, "how long the run lasts")
	fl.Int64VarP(&f.requests, "requests", "n", 0, "end after this many requests instead of --duration")
	fl.StringVar(&f.namespace, "namespace", "", "namespace of the blocks (16 hex digits; default "+benchNamespace.String()+")")
	fl.BoolVar(&f.grpc, "grpc", false, "kvstrata: move block bytes over gRPC, not the data plane")
	fl.BoolVar(&f.noPopulate, "no-populate", false, "get/lookup/mixed: read what an earlier put run with the same --keys and --size left, without putting it first")
	return cmd
}

// benchPlan is a checked bench command line.
type benchPlan struct {
	scheme, hostport string
	ns               index.NamespaceID
	cfg              loadgen.Config
}

// plan checks the flags and reports every problem at once as a usage error.
func (f benchFlags) plan(addr string, changed func(flag string) bool) (benchPlan, error) {
	var p benchPlan
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	target := f.target
	if target == "" {
		target = "kvstrata://" + addr
	}
	scheme, hostport, ok := strings.Cut(target, "://")
	if !ok {
		scheme, hostport = "kvstrata", target
	}
	p.scheme, p.hostport = strings.ToLower(scheme), hostport
	if p.scheme != "kvstrata" && p.scheme != "redis" {
		bad("--target %q: want kvstrata://HOST:PORT or redis://HOST:PORT", target)
	} else if _, _, err := net.SplitHostPort(hostport); err != nil {
		bad("--target %q: %q is not HOST:PORT", target, hostport)
	}
	op := loadgen.Op(strings.ToLower(f.op))
	p.cfg = loadgen.Config{Op: op, GetRatio: f.getRatio, Keys: f.keys, Batch: f.batch, Concurrency: f.concurrency,
		Requests: f.requests, Duration: f.duration, NoPopulate: f.noPopulate}
	size, err := parseSize(f.size)
	switch {
	case err != nil:
		bad("--size: %v", err)
	case size > 1<<30:
		bad("--size %s is over 1 GiB", f.size)
	}
	p.cfg.ValueSize = int(size)
	if f.keys == 0 && size >= 0 {
		p.cfg.Keys = int(min(max((256<<20)/max(size, 1), 16, int64(f.batch)), 16384))
	}
	switch {
	case f.requests < 0:
		bad("--requests is %d, must be positive", f.requests)
	case f.requests > 0 && changed("duration"):
		bad("--duration and --requests do not go together: a run is bound by one")
	case f.requests > 0:
		p.cfg.Duration = 0
	case f.duration <= 0:
		bad("--duration is %v, must be positive", f.duration)
	}
	if op != loadgen.OpMixed && changed("get-ratio") {
		bad("--get-ratio is for --op mixed only")
	}
	if p.scheme == "redis" {
		if f.grpc {
			bad("--grpc is for kvstrata targets only")
		}
		if f.batch != 1 {
			bad("--batch is %d: Redis targets take one key a request", f.batch)
		}
		if op == loadgen.OpLookup {
			bad("--op lookup is for kvstrata targets only")
		}
	}
	p.ns = benchNamespace
	if f.namespace != "" {
		if p.ns, err = index.ParseNamespaceID(f.namespace); err != nil {
			bad("--namespace: %v", err)
		}
	}
	cfg := p.cfg // checked as loadgen.Run will take it, with its defaults
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		bad("%s", strings.TrimPrefix(err.Error(), "loadgen: "))
	}
	if len(probs) > 0 {
		return benchPlan{}, usageErrorf("bench: %s", strings.Join(probs, "; "))
	}
	return p, nil
}

func (a *app) runBench(ctx context.Context, f benchFlags, changed func(flag string) bool) error {
	if a.timeout <= 0 {
		return usageErrorf("--timeout is %v, must be positive", a.timeout)
	}
	p, err := f.plan(a.addr, changed)
	if err != nil {
		return err
	}
	var dial loadgen.Dialer
	path := "resp"
	if p.scheme == "kvstrata" {
		c, err := a.connectTo(ctx, p.hostport, client.Options{NoDataPlane: f.grpc, PoolSize: p.cfg.Concurrency})
		if err != nil {
			return err
		}
		if limit := c.Info().GetMaxBlockSize(); uint64(p.cfg.ValueSize) > limit {
			return fmt.Errorf("bench: --size %s is over the node's %s block limit", f.size, formatBytes(limit))
		}
		dial, path = loadgen.Kvstrata(c, p.ns), c.DataPlane()
	} else {
		dial = loadgen.Redis(p.hostport, p.ns, a.timeout)
	}
	var bar *benchBar
	if a.interactive(a.stderr) {
		bar = &benchBar{w: a.stderr}
		p.cfg.Progress = bar.update
	}
	rep, err := loadgen.Run(ctx, dial, p.cfg)
	bar.exit()
	if rep == nil {
		return fmt.Errorf("bench: %w", err)
	}
	out := newBenchOutput(p, path, rep)
	if a.output == outputJSON {
		if werr := writeJSON(a.stdout, out); werr != nil {
			return werr
		}
	} else if werr := a.writeBench(out); werr != nil {
		return werr
	}
	switch r := rep.Run; {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("bench: interrupted after %s", r.Elapsed.Round(time.Millisecond))
	case err != nil:
		return fmt.Errorf("bench: %w", err)
	case r.Errors > 0 || rep.Populate != nil && rep.Populate.Errors > 0:
		first := r.FirstError
		if rep.Populate != nil && rep.Populate.FirstError != nil {
			first = rep.Populate.FirstError
		}
		return fmt.Errorf("bench: %d errors (%d wrong values); first: %v", out.errors(), out.mismatches(), first)
	}
	return nil
}

// benchBar draws a progress bar per phase on a terminal.
type benchBar struct {
	w     io.Writer
	phase string
	bar   *progressbar.ProgressBar
}

func (b *benchBar) update(p loadgen.Progress) {
	if p.Phase != b.phase {
		b.exit()
		b.phase = p.Phase
		max := p.Total
		if max == 0 {
			max = p.Duration.Milliseconds()
		}
		b.bar = progressbar.NewOptions64(max, progressbar.OptionSetWriter(b.w), progressbar.OptionSetDescription(p.Phase),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish(), progressbar.OptionSetWidth(30))
	}
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.Bytes) / p.Elapsed.Seconds() / 1e6
	}
	b.bar.Describe(fmt.Sprintf("%-8s %s requests, %.0f MB/s", p.Phase, thousands(p.Requests), rate))
	if p.Total > 0 {
		_ = b.bar.Set64(p.Requests)
	} else {
		_ = b.bar.Set64(min(p.Elapsed.Milliseconds(), p.Duration.Milliseconds()))
	}
}

func (b *benchBar) exit() {
	if b != nil && b.bar != nil {
		_ = b.bar.Exit()
		b.bar = nil
	}
}

// formatLatency formats d with three significant digits: 812µs, 5.12ms.
func formatLatency(d time.Duration) string {
	sig3 := func(v float64) string {
		switch {
		case v < 10:
			return strconv.FormatFloat(v, 'f', 2, 64)
		case v < 100:
			return strconv.FormatFloat(v, 'f', 1, 64)
		}
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		return sig3(float64(d)/1e3) + "µs"
	case d < time.Second:
		return sig3(float64(d)/1e6) + "ms"
	}
	return sig3(d.Seconds()) + "s"
}

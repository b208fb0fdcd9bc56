package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/connector/kube"
	"github.com/kvstrata/kvstrata/planner/connector/virtual"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/planner/scrape"
)

// DefaultPlannerListen is the planner's default HTTP address.
const DefaultPlannerListen = "127.0.0.1:8090"

var _ lifecycle.Part = (*plannerPart)(nil)

// connectorFlags are what the connectors are made from.
type connectorFlags struct {
	pools                                  map[planner.Pool]planner.Limits
	kubeTargets, kubeNamespace, kubeconfig string
	// cache is the cache node at --cache, dialled; nil without --cache.
	cache *client.Client
}

// plannerConnectors make the connectors --connector names. A connector
// package adds itself here.
var plannerConnectors = map[string]func(f connectorFlags) (planner.Connector, error){
	"none": func(f connectorFlags) (planner.Connector, error) { return noConnector(f.pools), nil },
	"kube": func(f connectorFlags) (planner.Connector, error) {
		ts, err := kube.ParseTargets(f.kubeTargets)
		if err != nil {
			return nil, fmt.Errorf("--kube-targets %q: %w", f.kubeTargets, err)
		}
		for p := range f.pools {
			if _, ok := ts[p]; !ok {
				return nil, fmt.Errorf("--kube-targets %q: no workload for pool %s", f.kubeTargets, p)
			}
		}
		return kube.NewFromKubeconfig(f.kubeconfig, f.kubeNamespace, ts)
	},
	"virtual": func(f connectorFlags) (planner.Connector, error) {
		if f.cache == nil {
			return nil, errors.New("needs --cache ADDR, the cache node whose replicated state holds the decisions")
		}
		initial := make(map[planner.Pool]int, len(f.pools))
		for p, l := range f.pools {
			initial[p] = l.Min
		}
		return virtual.New(virtual.NewCluster(f.cache), virtual.Config{Initial: initial}), nil
	},
}

func newPlannerCommand(stderr io.Writer) *cobra.Command {
	var cfg planner.Config
	var frontendURL, promURL, promSelector, profile, pools, manual, connector, listen, cache string
	var cf connectorFlags
	var lim sim.WorkerLimits
	var t flagTable
	var proc processFlags
	cmd := &cobra.Command{
		Use:   "planner",
		Short: "Size the worker pools to the coming load within TTFT and ITL targets",
		Long: `planner reads what the frontend measured every --interval, from its
/metrics (--frontend) or from a Prometheus server that scrapes it
(--prometheus), predicts the request rate over a new worker's start-up
(--predictor), and from the profile's model of a worker (--profile, the
format kvstrata profile writes and the sim engine replays) computes the
workers each pool needs to keep the mean TTFT within --slo-ttft and the
mean ITL within --slo-itl:

  prefill    = ⌈rate × ISL × (1 − cached fraction) × correction ÷ prefill tokens/s per worker at the TTFT target⌉
  decode     = ⌈rate × OSL ÷ decode tokens/s per worker at the ITL target and context ISL + OSL/2⌉
  aggregated = the two shares of a worker's time, summed

with corrections from observed against modelled latency. It scales up at
once; it scales down only when the smaller size has sufficed (need ×
1.15 ≤ size) for 3 windows in a row and --cooldown has passed since the
pool's last change, by at most half the pool at a time. After 2 windows
without a request every pool goes to its minimum; a window whose metrics
could not be read holds every pool. A size the planner did not ask for is
a manual change: --manual respect:D freezes the pool at it for D,
--manual override scales it back; the log says which.

--mode advisory decides, logs and publishes (GET /v1/planner/status as
JSON, /metrics) but never scales; --mode active asks the --connector to.
Connectors: none (nothing to scale: advisory only; each pool's current
size is read as its minimum); kube (each pool's Deployment or StatefulSet,
--kube-targets, scaled through the scale subresource: the planner's
service account needs get/update on deployments/scale or
statefulsets/scale); virtual (each change is written into the replicated
state of the cache cluster at --cache, for an outside system to carry out
and acknowledge: 'kvctl planner status' lists the decisions, 'kvctl
planner ack POOL SEQ REPLICAS' acknowledges one; a pool's next change
waits for the ack, or 10 min; before its first ack a pool counts as its
minimum).

With --cache, every step's decisions are also published there, one record
per pool (kvctl planner status, the node's GET /v1/planner/decisions),
written by "planner/CONNECTOR": advisory ones with mode advisory, which
ask nothing of anyone; active ones that another connector carries out.
With --mode active --connector virtual the connector's records (written by
"planner") are the published ones.

--pools is aggregated:MIN-MAX, or prefill:MIN-MAX,decode:MIN-MAX.`,
		Example: `  # Advise on an aggregated pool of 1 to 8 workers behind a frontend
  kvstrata planner --frontend http://127.0.0.1:8080 --profile profile.json \
    --slo-ttft 2s --slo-itl 50ms --pools aggregated:1-8
  curl -s 127.0.0.1:8090/v1/planner/status

  # Let an outside system scale: decisions in the cache cluster's state
  kvstrata planner --frontend http://127.0.0.1:8080 --mode active \
    --connector virtual --cache 127.0.0.1:7070 --pools aggregated:1-8
  kvctl --addr 127.0.0.1:7070 planner status
  kvctl --addr 127.0.0.1:7070 planner ack aggregated 1 2`,
		Args: noArgs("planner"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			probs := append(t.apply(), proc.apply()...)
			var src scraper
			switch {
			case (frontendURL == "") == (promURL == ""):
				probs = append(probs, "--frontend or --prometheus: give exactly one")
			case frontendURL != "":
				u, err := metricsURL(frontendURL)
				if err != nil {
					probs = append(probs, fmt.Sprintf("--frontend %q: %v", frontendURL, err))
				}
				src = &scrape.Frontend{URL: u, Client: &http.Client{Timeout: 10 * time.Second}}
			default:
				if u, err := url.Parse(promURL); err != nil || u.Scheme == "" || u.Host == "" {
					probs = append(probs, fmt.Sprintf("--prometheus %q: want http://host:port", promURL))
				}
				src = &scrape.API{URL: promURL, Window: cfg.Interval, Selector: promSelector, Client: &http.Client{Timeout: 10 * time.Second}}
			}
			var err error
			if cfg.Pools, err = parsePools(pools); err != nil {
				probs = append(probs, fmt.Sprintf("--pools %q: %v", pools, err))
			}
			if cfg.Manual, err = parseManual(manual); err != nil {
				probs = append(probs, fmt.Sprintf("--manual %q: %v", manual, err))
			}
			newConn, ok := plannerConnectors[connector]
			if !ok {
				probs = append(probs, fmt.Sprintf("--connector %q: want one of %s", connector, strings.Join(slices.Sorted(mapKeys(plannerConnectors)), ", ")))
			}
			if connector == "none" && cfg.Mode == planner.ModeActive {
				probs = append(probs, "--mode active: --connector none scales nothing; give a connector, or --mode advisory")
			}
			if connector == "virtual" && cache == "" {
				probs = append(probs, "--connector virtual needs --cache ADDR, the gRPC address of a cache node whose replicated state holds the decisions")
			}
			prof := sim.DefaultProfile()
			if profile != "" {
				if prof, err = sim.ReadProfile(profile); err != nil {
					probs = append(probs, fmt.Sprintf("--profile %q: %v", profile, err))
				}
			}
			if w := prof.Worker; w != nil { // a version-2 profile's worker, unless a flag says otherwise
				lim.KVTokens = cmp.Or(lim.KVTokens, w.KVTokens)
				lim.MaxNumSeqs = cmp.Or(lim.MaxNumSeqs, w.MaxNumSeqs)
				lim.MaxNumBatchedTokens = cmp.Or(lim.MaxNumBatchedTokens, w.MaxNumBatchedTokens)
			}
			model, err := perf.New(prof, lim)
			if err != nil && len(probs) == 0 {
				probs = append(probs, err.Error())
			}
			cfg.EnsureDefaults()
			if err := cfg.Validate(); err != nil {
				for _, m := range strings.Split(strings.TrimPrefix(err.Error(), planner.ErrBadConfig.Error()+": "), "; ") {
					if cfg.Pools != nil || !strings.HasPrefix(m, "pools") {
						probs = append(probs, m)
					}
				}
			}
			cfg.Registry = prometheus.NewRegistry()
			log := proc.logger(stderr)
			var p *planner.Planner
			if len(probs) == 0 && cache != "" {
				if cf.cache, err = dialPlannerCache(cmd.Context(), cache); err != nil {
					return err
				}
				defer cf.cache.Close()
			}
			if len(probs) == 0 {
				cf.pools = cfg.Pools
				conn, err := newConn(cf)
				if err != nil {
					probs = append(probs, fmt.Sprintf("--connector %s: %v", connector, err))
				} else if p, err = planner.New(cfg, model, conn, log); err != nil { // the config is valid: the predictor
					probs = append(probs, fmt.Sprintf("--predictor %q: %s", cfg.Predictor, strings.TrimPrefix(err.Error(), planner.ErrBadConfig.Error()+": ")))
				}
			}
			if len(probs) > 0 {
				return usageError{fmt.Errorf("bad flags:\n  %s", strings.Join(probs, "\n  "))}
			}
			part := &plannerPart{p: p, src: src, reg: cfg.Registry, interval: cfg.Interval, listen: listen, log: log,
				failed: make(chan error, 1)}
			// An active virtual connector writes its own records, with the
			// ack handshake; publishing too would overtake them. Published
			// records name the connector that carries them out, so that an
			// outside system tells them from the virtual connector's.
			if cf.cache != nil && !(connector == "virtual" && cfg.Mode == planner.ModeActive) {
				pub := virtual.NewCluster(cf.cache)
				pub.Planner = "planner/" + connector
				part.publish = pub
			}
			r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: proc.shutdown, Logger: log}, part)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	t.fs = fs
	t.str("frontend", "", "the frontend to read: its base URL (http://host:port) or its /metrics URL", &frontendURL)
	t.str("prometheus", "", "instead, a Prometheus server that scrapes the frontend (http://host:port), read through /api/v1/query", &promURL)
	t.str("prometheus-selector", "", `with --prometheus, label matchers for the frontend's series, e.g. job="frontend" ("": all)`, &promSelector)
	t.str("profile", "", `the worker profile (JSON, kvstrata profile's format; "": the Dynamo mocker's polynomial the sim engine uses by default)`, &profile)
	t.int("kv-tokens", 0, fmt.Sprintf("a worker's KV pool in tokens (0: the profile's worker's, else %d)", perf.DefaultKVTokens), &lim.KVTokens)
	t.int("max-num-seqs", 0, fmt.Sprintf("a worker's most running sequences (0: the profile's worker's, else %d)", perf.DefaultMaxSeqs), &lim.MaxNumSeqs)
	t.int("max-num-batched-tokens", 0, fmt.Sprintf("tokens a worker computes in one step: longer prompts prefill in chunks of it (0: the profile's worker's, else %d)", perf.DefaultMaxBatched), &lim.MaxNumBatchedTokens)
	t.duration("slo-ttft", 2*time.Second, "the time-to-first-token target: on the mean, or on --slo-ttft-quantile", &cfg.TTFT)
	t.duration("slo-itl", 50*time.Millisecond, "the mean inter-token latency target", &cfg.ITL)
	t.float("slo-ttft-quantile", 0, "size for this quantile of TTFT within --slo-ttft, e.g. 0.99 (0: the mean)", &cfg.TTFTQuantile)
	t.duration("interval", planner.DefaultInterval, "one observation window: the planner decides once per interval", &cfg.Interval)
	t.duration("startup-delay", planner.DefaultStartupDelay, "how long a new worker takes to serve: predictions look that far ahead", &cfg.StartupDelay)
	t.duration("cooldown", planner.DefaultCooldown, "least time between a pool's last change and its next scale-down", &cfg.Cooldown)
	t.str("mode", planner.ModeAdvisory, "active (scale through --connector) or advisory (decide and publish only)", &cfg.Mode)
	t.str("pools", "aggregated:1-8", "the pools and their sizes: aggregated:MIN-MAX, or prefill:MIN-MAX,decode:MIN-MAX", &pools)
	t.int("budget", 0, "most workers of all pools together; over it both shrink in proportion to their needs (0: no bound)", &cfg.Budget)
	t.str("predictor", planner.DefaultPredictor, "the request-rate predictor: constant, ma:N, ewma[:a], holt:a,b, kalman[:q_level,q_trend,r], holt-winters:period=P[,a,b,g], arima or arima:p,d,q (see planner/predict)", &cfg.Predictor)
	t.str("manual", "respect:"+planner.DefaultRespect.String(), "a size the planner did not ask for: respect:DURATION freezes the pool at it that long; override scales it back", &manual)
	t.float("band", planner.DefaultBand, "hysteresis: a pool shrinks to n only when need × (1 + band) ≤ n", &cfg.Band)
	t.int("down-stable", planner.DefaultDownStable, "windows in a row a smaller size must suffice before a scale-down", &cfg.DownStable)
	t.int("max-down-step", 0, "most workers one scale-down removes (0: half the pool, rounded up)", &cfg.MaxDownStep)
	t.int("idle-windows", planner.DefaultIdleWindows, "windows without a request after which every pool goes to its minimum", &cfg.IdleWindows)
	t.str("connector", "none", "what carries out decisions: none (advisory only), kube (Kubernetes workloads' scale subresource) or virtual (records in the cache cluster at --cache, for an outside system to carry out and ack)", &connector)
	t.str("cache", "", `gRPC address of a kvstrata cache node (host:port): the virtual connector's records, and where every decision is published for kvctl planner status ("": none)`, &cache)
	t.str("kube-targets", "", "kube: the workload of each pool, POOL=KIND/NAME,... e.g. aggregated=Deployment/kvstrata-worker", &cf.kubeTargets)
	t.str("kube-namespace", "default", "kube: the workloads' namespace", &cf.kubeNamespace)
	t.str("kubeconfig", "", `kube: the kubeconfig file ("": the pod's service account, in-cluster)`, &cf.kubeconfig)
	t.str("listen", DefaultPlannerListen, "HTTP address of GET /v1/planner/status (JSON), /metrics and /readyz", &listen)
	proc.add(fs)
	return cmd
}

// plannerCacheDialTimeout bounds the wait for --cache's node at start.
const plannerCacheDialTimeout = 10 * time.Second

// dialPlannerCache connects to the cache node at addr: one that does not
// answer within plannerCacheDialTimeout is an error that names it.
func dialPlannerCache(ctx context.Context, addr string) (*client.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, plannerCacheDialTimeout)
	defer cancel()
	c, err := client.Dial(dctx, addr, client.Options{NoDataPlane: true})
	if err != nil {
		return nil, fmt.Errorf("--cache %s: the cache node does not answer (is kvstrata serve running there?): %w", addr, err)
	}
	return c, nil
}

// metricsURL is the /metrics URL of a frontend given by its base URL or
// that URL itself.
func metricsURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", errors.New("want http://host:port or its /metrics URL")
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	return u.String(), nil
}

// parsePools reads aggregated:MIN-MAX or prefill:MIN-MAX,decode:MIN-MAX.
func parsePools(s string) (map[planner.Pool]planner.Limits, error) {
	pools := map[planner.Pool]planner.Limits{}
	for _, part := range strings.Split(s, ",") {
		name, rng, ok := strings.Cut(part, ":")
		lo, hi, ok2 := strings.Cut(rng, "-")
		minN, err1 := strconv.Atoi(lo)
		maxN, err2 := strconv.Atoi(hi)
		if !ok || !ok2 || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q is not POOL:MIN-MAX", part)
		}
		p := planner.Pool(name)
		if p != planner.Aggregated && p != planner.Prefill && p != planner.Decode {
			return nil, fmt.Errorf("pool %q: want aggregated, prefill or decode", name)
		}
		if _, dup := pools[p]; dup {
			return nil, fmt.Errorf("pool %s given twice", name)
		}
		pools[p] = planner.Limits{Min: minN, Max: maxN}
	}
	return pools, nil
}

// parseManual reads respect:DURATION or override.
func parseManual(s string) (planner.ManualPolicy, error) {
	if s == "override" {
		return planner.ManualPolicy{Override: true}, nil
	}
	if d, ok := strings.CutPrefix(s, "respect:"); ok {
		v, err := time.ParseDuration(d)
		if err == nil && v > 0 {
			return planner.ManualPolicy{Respect: v}, nil
		}
	}
	return planner.ManualPolicy{}, errors.New("want respect:DURATION (e.g. respect:10m) or override")
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// noConnector is --connector none: it has no deployment to read or
// scale, and reports every pool at its minimum.
type noConnector map[planner.Pool]planner.Limits

func (c noConnector) Replicas(context.Context) (map[planner.Pool]planner.Replicas, error) {
	out := map[planner.Pool]planner.Replicas{}
	for p, l := range c {
		out[p] = planner.Replicas{Desired: l.Min, Ready: l.Min}
	}
	return out, nil
}

func (noConnector) Scale(context.Context, planner.Pool, int) error {
	return errors.New("connector none scales nothing")
}

// scraper observes one window ending at now.
type scraper interface {
	Scrape(ctx context.Context, now time.Time) (planner.Observation, error)
}

// plannerPart runs the loop and serves its status and metrics.
type plannerPart struct {
	p        *planner.Planner
	src      scraper
	reg      *prometheus.Registry
	interval time.Duration
	listen   string
	log      *slog.Logger
	failed   chan error
	// status is GET /v1/planner/status's answer; nil is the planner's Status.
	status func(context.Context) any
	// publish, if set, gets every step's decisions (virtual.Publish).
	publish virtual.Store

	srv    *http.Server
	ln     net.Listener
	stop   context.CancelFunc
	done   sync.WaitGroup
	served chan struct{}
}

func (pp *plannerPart) Name() string         { return "planner" }
func (pp *plannerPart) Failed() <-chan error { return pp.failed }
func (pp *plannerPart) Addr() string         { return pp.ln.Addr().String() }

func (pp *plannerPart) Start(context.Context) (err error) {
	pp.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if pp.ln, err = net.Listen("tcp", pp.listen); err != nil {
		return fmt.Errorf("planner: listen on %s: %w", pp.listen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/planner/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		var st any = pp.p.Status()
		if pp.status != nil {
			st = pp.status(r.Context())
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(pp.reg, promhttp.HandlerOpts{}))
	ok := func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }
	mux.HandleFunc("GET /readyz", ok)
	mux.HandleFunc("GET /health", ok)
	pp.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(pp.log.Handler(), slog.LevelWarn)}
	pp.served = make(chan struct{})
	go func() {
		defer close(pp.served)
		if err := pp.srv.Serve(pp.ln); !errors.Is(err, http.ErrServerClosed) {
			pp.failed <- fmt.Errorf("HTTP server on %s: %w", pp.ln.Addr(), err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	pp.stop = cancel
	pp.done.Go(func() { pp.run(ctx) })
	pp.log.Info("planner serving", "http", pp.ln.Addr().String(), "interval", pp.interval)
	return nil
}

// run steps the planner once per interval until ctx ends.
func (pp *plannerPart) run(ctx context.Context) {
	if _, err := pp.src.Scrape(ctx, time.Now()); err != nil && !errors.Is(err, scrape.ErrBaseline) {
		pp.log.Warn("planner: first scrape", "err", err)
	}
	tick := time.NewTicker(pp.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			obs, err := pp.src.Scrape(ctx, now)
			switch {
			case errors.Is(err, scrape.ErrBaseline):
				continue
			case err != nil:
				pp.log.Warn("planner: scrape failed; holding every pool", "err", err)
				obs.OK = false
			}
			ds, err := pp.p.Step(ctx, obs)
			if err != nil && ctx.Err() == nil {
				pp.log.Warn("planner: step", "err", err)
			}
			if pp.publish != nil {
				if err := virtual.Publish(ctx, pp.publish, ds); err != nil && ctx.Err() == nil {
					pp.log.Warn("planner: publishing the decisions", "err", err)
				}
			}
		}
	}
}

func (pp *plannerPart) Stop(ctx context.Context) error {
	pp.stop()
	pp.done.Wait()
	err := pp.srv.Shutdown(ctx)
	<-pp.served
	return err
}

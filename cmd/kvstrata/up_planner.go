package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/planner"
	"github.com/kvstrata/kvstrata/planner/connector/local"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/planner/scrape"
	"github.com/kvstrata/kvstrata/router/frontend"
)

// This file is `up --planner`: the planner sizes up's aggregated workers
// through planner/connector/local, which spawns workers in the process
// and drains the ones it scales down.

// upPlannerFlags are the settings of `up --planner`.
type upPlannerFlags struct {
	profile          string
	ttft, itl        time.Duration
	minW, maxW       int
	mode             string
	interval         time.Duration
	listen           string
	drainTimeout     time.Duration
	startupDelay     time.Duration
	cooldown         time.Duration
	predictor        string
	changed          func(name string) bool
	plannerFlagNames []string
	prof             sim.Profile // read by check
}

func addUpPlannerFlags(t *flagTable, f *upPlannerFlags) {
	t.str("planner", "", `run the planner over the workers, with this worker profile (sim's profile JSON: the model of a worker's latencies) ("": no planner)`, &f.profile)
	t.duration("slo-ttft", 0, "planner: the time-to-first-token target (mean), e.g. 2s; required with --planner", &f.ttft)
	t.duration("slo-itl", 0, "planner: the inter-token latency target (mean), e.g. 50ms; required with --planner", &f.itl)
	t.int("min-workers", 1, "planner: fewest aggregated workers (≥ 1)", &f.minW)
	t.int("max-workers", 4, "planner: most aggregated workers", &f.maxW)
	t.str("planner-mode", planner.ModeActive, "planner: active (scales) or advisory (decides and publishes, never scales)", &f.mode)
	t.duration("planner-interval", 30*time.Second, "planner: one observation window of the frontend's /metrics", &f.interval)
	t.duration("planner-startup-delay", 60*time.Second, "planner: how long a new worker takes to serve; predictions look that far ahead", &f.startupDelay)
	t.duration("planner-cooldown", 5*time.Minute, "planner: least time between a change of the pool and its next scale-down", &f.cooldown)
	t.str("planner-predictor", planner.DefaultPredictor, "planner: the request-rate predictor, as kvstrata planner's --predictor: constant, ma:N, ewma[:a], holt:a,b, kalman[:…], holt-winters:period=P[,…], arima[:p,d,q]", &f.predictor)
	t.str("planner-listen", DefaultPlannerListen, "planner: HTTP address of GET /v1/planner/status", &f.listen)
	t.duration("drain-timeout", local.DefaultDrainTimeout, "planner: longest drain of a worker scaled down (its requests finish, its KV reaches the cache); past it the rest is cut", &f.drainTimeout)
	f.plannerFlagNames = []string{"slo-ttft", "slo-itl", "min-workers", "max-workers", "planner-mode", "planner-interval",
		"planner-startup-delay", "planner-cooldown", "planner-predictor", "planner-listen", "drain-timeout"}
}

// check reports what is wrong with the planner's flags, given up's
// worker counts and frontend.
func (f *upPlannerFlags) check(workers int, disaggregated bool, frontendListen string) []string {
	var probs []string
	if f.profile == "" {
		for _, name := range f.plannerFlagNames {
			if f.changed(name) {
				probs = append(probs, fmt.Sprintf("--%s needs --planner PROFILE", name))
			}
		}
		return probs
	}
	prof, err := sim.ReadProfile(f.profile)
	if err != nil {
		probs = append(probs, fmt.Sprintf("--planner %s: %v", f.profile, err))
	}
	f.prof = prof
	if f.ttft <= 0 {
		probs = append(probs, fmt.Sprintf("--slo-ttft %v: --planner needs a positive time-to-first-token target, e.g. --slo-ttft 2s", f.ttft))
	}
	if f.itl <= 0 {
		probs = append(probs, fmt.Sprintf("--slo-itl %v: --planner needs a positive inter-token latency target, e.g. --slo-itl 50ms", f.itl))
	}
	if f.minW < 1 || f.maxW < f.minW || f.maxW > 1000 {
		probs = append(probs, fmt.Sprintf("--min-workers %d --max-workers %d: need 1 ≤ min ≤ max ≤ 1000", f.minW, f.maxW))
	} else if f.changed("workers") && (workers < f.minW || workers > f.maxW) {
		probs = append(probs, fmt.Sprintf("--workers %d: with --planner, start within [--min-workers, --max-workers] = [%d, %d]", workers, f.minW, f.maxW))
	}
	if f.mode != planner.ModeActive && f.mode != planner.ModeAdvisory {
		probs = append(probs, fmt.Sprintf("--planner-mode %q: active or advisory", f.mode))
	}
	if f.interval <= 0 || f.startupDelay < 0 || f.cooldown < 0 || f.drainTimeout <= 0 {
		probs = append(probs, "--planner-interval and --drain-timeout must be positive, --planner-startup-delay and --planner-cooldown not negative")
	}
	if disaggregated {
		probs = append(probs, "--planner with --prefill/--decode: the planner sizes aggregated workers only for now")
	}
	if frontendListen == "" {
		probs = append(probs, `--planner with --frontend "": the planner needs the frontend (its metrics, its router)`)
	}
	if f.listen == "" {
		probs = append(probs, "--planner-listen is empty: the planner's status needs an address")
	}
	if len(probs) == 0 {
		// The planner checks the rest (the predictor's spec among them).
		m, err := perf.New(f.prof, sim.WorkerLimits{})
		if err == nil {
			_, err = planner.New(f.config(), m, nopConnector{}, nil)
		}
		if err != nil {
			probs = append(probs, err.Error())
		}
	}
	return probs
}

// config is the planner's configuration from the flags.
func (f *upPlannerFlags) config() planner.Config {
	return planner.Config{Mode: f.mode, Interval: f.interval, StartupDelay: f.startupDelay, Cooldown: f.cooldown,
		TTFT: f.ttft, ITL: f.itl, Pools: map[planner.Pool]planner.Limits{planner.Aggregated: {Min: f.minW, Max: f.maxW}},
		Predictor: f.predictor}
}

// nopConnector lets planner.New check a configuration.
type nopConnector struct{}

func (nopConnector) Replicas(context.Context) (map[planner.Pool]planner.Replicas, error) {
	return nil, nil
}
func (nopConnector) Scale(context.Context, planner.Pool, int) error { return nil }

// initialWorkers is how many workers up starts with under the planner:
// --workers if given, else --min-workers.
func (f *upPlannerFlags) initialWorkers(workers int) int {
	if f.changed("workers") {
		return workers
	}
	return f.minW
}

// upWorker is an in-process worker as the local connector sees it.
type upWorker struct{ w *worker.Worker }

var _ local.Worker = upWorker{}

func (u upWorker) URL() string        { return "http://" + u.w.Addr() }
func (u upWorker) Role() planner.Pool { return planner.Pool(u.w.Config().Role) }
func (u upWorker) Stop(ctx context.Context) error {
	return u.w.Stop(ctx)
}
func (u upWorker) Drain(ctx context.Context) (local.DrainReport, error) {
	r, err := u.w.Drain(ctx)
	return local.DrainReport{InFlight: r.InFlight, Unfinished: r.Unfinished, Offloaded: r.Offloaded, Dropped: r.Dropped, Took: r.Took}, err
}

// spec is the worker as the frontend follows it.
func (u upWorker) spec() frontend.WorkerSpec {
	s := frontend.WorkerSpec{URL: u.URL(), Role: u.w.Config().Role}
	if ev, replay := u.w.KVEventsAddrs(); ev != "" {
		s.Events = "tcp://" + ev
		if replay != "" {
			s.Replay = "tcp://" + replay
		}
	}
	return s
}

// upSpawner starts workers like up's, in the process, on ports the
// system chooses.
type upSpawner struct {
	tmpl   worker.Config // Role, Listen and the KV-event endpoints are set per worker
	host   string
	events bool
	log    *slog.Logger
}

func (s upSpawner) Spawn(ctx context.Context, pool planner.Pool) (local.Worker, error) {
	c := s.tmpl
	c.Role = string(pool)
	c.Listen = net.JoinHostPort(s.host, "0")
	c.KVEvents, c.KVEventsReplay = "", ""
	if s.events {
		// The publisher takes the port the system chooses; its replay
		// socket needs an endpoint of its own, so one is picked here.
		c.KVEvents = "tcp://" + net.JoinHostPort(s.host, "0")
		replay, err := pickFreeAddr(s.host)
		if err != nil {
			return nil, err
		}
		c.KVEventsReplay = "tcp://" + replay
	}
	c.Logger = s.log
	w, err := worker.New(c)
	if err != nil {
		return nil, err
	}
	if err := w.Start(ctx); err != nil {
		return nil, err
	}
	return upWorker{w}, nil
}

// pickFreeAddr is an address on host that nothing listened on a moment ago.
func pickFreeAddr(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// upRouter is the frontend's router as the local connector sees it.
type upRouter struct{ fe *frontendPart }

func (r upRouter) router() (*frontend.Router, error) {
	if r.fe.router == nil {
		return nil, errors.New("the frontend is not started")
	}
	return r.fe.Router(), nil
}

func (r upRouter) AddWorker(w local.Worker) error {
	u, ok := w.(upWorker)
	if !ok {
		return fmt.Errorf("worker %s is not one of up's", w.URL())
	}
	rt, err := r.router()
	if err != nil {
		return err
	}
	return rt.AddWorker(u.spec())
}

func (r upRouter) RemoveWorker(url string) bool {
	rt, err := r.router()
	return err == nil && rt.RemoveWorker(url)
}

// Load is the requests the router has on the worker of url.
func (r upRouter) Load(url string) int {
	rt, err := r.router()
	if err != nil {
		return 0
	}
	l := rt.Load(url)
	return l.Prefilling + l.Decoding
}

// workerPool is up's workers under the planner, as one part of the
// process: it starts the first ones, and the local connector owns them
// all from then on; Stop stops every worker it has.
type workerPool struct {
	cfgs   []worker.Config
	conn   *local.Connector
	failed chan error
}

func (p *workerPool) Name() string         { return "workers (planner)" }
func (p *workerPool) Failed() <-chan error { return p.failed }

func (p *workerPool) Start(ctx context.Context) error {
	var started []*worker.Worker
	for _, c := range p.cfgs {
		w, err := worker.New(c)
		if err == nil {
			err = w.Start(ctx)
		}
		if err != nil {
			for _, s := range started {
				s.Stop(ctx)
			}
			return err
		}
		started = append(started, w)
	}
	for _, w := range started {
		if err := p.conn.Adopt(upWorker{w}); err != nil {
			return err
		}
	}
	return nil
}

func (p *workerPool) Stop(ctx context.Context) error { return p.conn.Close(ctx) }

// upStatus is GET /v1/planner/status's answer.
type upStatus struct {
	Mode      string                            `json:"mode"`
	Interval  string                            `json:"interval"`
	SLO       map[string]string                 `json:"slo"`
	Limits    map[planner.Pool]planner.Limits   `json:"limits"`
	Replicas  map[planner.Pool]planner.Replicas `json:"replicas"`
	Planner   planner.Status                    `json:"planner"`
	Connector local.Status                      `json:"connector"`
}

// upStatusOf is the answer of `up --planner`'s GET /v1/planner/status:
// the planner's own status with the limits and the local connector's workers.
func upStatusOf(p *planner.Planner, conn *local.Connector, cfg planner.Config) func(context.Context) any {
	return func(ctx context.Context) any {
		reps, _ := conn.Replicas(ctx)
		return upStatus{Mode: cfg.Mode, Interval: cfg.Interval.String(),
			SLO:    map[string]string{"ttft": cfg.TTFT.String(), "itl": cfg.ITL.String()},
			Limits: cfg.Pools, Replicas: reps, Planner: p.Status(), Connector: conn.Status()}
	}
}

var _ lifecycle.Part = (*workerPool)(nil)

// upPlanner builds the parts of `up --planner`: the workers the local
// connector owns (to run where up's workers run) and the planner (to run
// after the frontend, and stop before it).
func upPlanner(f *upPlannerFlags, cfgs []worker.Config, tmpl worker.Config, host string, events bool, fe *frontendPart, log *slog.Logger) (*workerPool, *plannerPart, error) {
	w := cfgs[0]
	m, err := perf.New(f.prof, sim.WorkerLimits{KVTokens: w.Blocks * 16, BlockTokens: 16, MaxNumSeqs: w.MaxNumSeqs, MaxNumBatchedTokens: w.MaxNumBatchedTokens})
	if err != nil {
		return nil, nil, fmt.Errorf("--planner %s: %w", f.profile, err)
	}
	tmpl.Cache = w.Cache
	conn, err := local.New(local.Config{Spawner: upSpawner{tmpl: tmpl, host: host, events: events, log: log}, Router: upRouter{fe},
		Pools: []planner.Pool{planner.Aggregated}, DrainTimeout: f.drainTimeout, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	pcfg := f.config()
	p, err := planner.New(pcfg, m, conn, log)
	if err != nil {
		return nil, nil, fmt.Errorf("planner: %w", err)
	}
	pool := &workerPool{cfgs: cfgs, conn: conn, failed: make(chan error, 1)}
	scr := &scrape.Frontend{URL: "http://" + fe.listen + "/metrics", Client: &http.Client{Timeout: min(pcfg.Interval, 10*time.Second)}}
	pp := &plannerPart{p: p, src: scr, reg: p.Registry(), interval: pcfg.Interval, listen: f.listen, log: log,
		status: upStatusOf(p, conn, pcfg), failed: make(chan error, 1)}
	return pool, pp, nil
}

// plannerUsage is --planner's part of up's help.
var plannerUsage = strings.TrimSpace(`
With --planner PROFILE the workers are sized by the planner: it observes
the frontend's /metrics every --planner-interval, predicts the load and
asks for the fewest aggregated workers (within --min-workers and
--max-workers) that meet --slo-ttft and --slo-itl by the worker model of
PROFILE. A new worker starts in the process on a port the system chooses
and joins the frontend once it serves; a worker scaled down leaves the
frontend at once, turns new requests away (503), finishes the ones it has
and offloads its KV to the cache node before it stops (up to
--drain-timeout), so a scale-down loses no computed prefix. The planner's
state is at GET /v1/planner/status on --planner-listen, and its metrics
(kvstrata_planner_*) at GET /metrics there.`)

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/engine/openai"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
	"github.com/kvstrata/kvstrata/router/frontend"
	"github.com/kvstrata/kvstrata/router/policy"
)

// DefaultFrontendListen is the frontend's default HTTP address.
const DefaultFrontendListen = "127.0.0.1:8080"

var (
	_ lifecycle.Part    = (*frontendPart)(nil)
	_ lifecycle.Checker = (*frontendPart)(nil)
)

func newFrontendCommand(stderr io.Writer) *cobra.Command {
	model := worker.Config{} // the workers' model: its namespace, name, context length, stop tokens
	model.EnsureDefaults()
	fcfg := frontend.Config{}
	listen := DefaultFrontendListen
	var specs []string
	var policyName string
	var t flagTable
	var proc processFlags
	cmd := &cobra.Command{
		Use:   "frontend",
		Short: "Run the frontend: the OpenAI API users talk to, routing each request to the worker that serves it best",
		Long: `frontend serves the OpenAI API (/v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics) on --listen and routes every request to one
of the --worker's: it tokenizes the prompt once, finds which worker holds
its prefix in its GPU pool (from each worker's KV events) and where the
cache at --cache holds the rest (per tier), lets --policy choose, and
streams the worker's answer back by token ids.

A worker whose connection fails, whose stream breaks or stalls (silent
for --stall-timeout while its /health fails too, or for --stall-limit) or
whose /health fails leaves the candidates at once and is probed back
with a backoff; a request whose worker dies mid-stream goes on on another
worker (prompt plus the tokens already produced), and the client sees one
stream. When
every worker is busy, requests wait in a bounded queue, then get 503 with
Retry-After.

--worker is URL[,events=ZMQ endpoint][,replay=ZMQ endpoint][,topic=T][,role=ROLE],
repeated: any OpenAI-compatible server that accepts token-id prompts and
return_token_ids (kvstrata worker, vLLM ≥ 0.10.2). --model and its flags
must describe the workers' model, whose block namespace the prompts are
hashed in.

--discover takes the workers that registered with the cache cluster at
--cache ('kvstrata worker --register') as well, listing the registry every
--discover-interval: every frontend replica, whichever node of the cluster
it asks, sees the same workers. It routes to the workers of its model's
namespace, each in the role it registered with (kvstrata worker --role):
registered prefill and decode workers serve disaggregated, as listed ones
do (with aggregated ones too, those decode beside the decode workers; with
prefill workers alone, none serves). A worker that deregisters or whose
lease ends leaves, and one that fails leaves the candidates at once, as a
--worker does.

Roles: aggregated (the default) workers serve whole requests. A list of
prefill and decode workers (kvstrata worker --role prefill|decode) serves
disaggregated: the decode worker is the least loaded; when the part of the
prompt that neither its pool nor the cache holds is longer than
--disagg-min-uncached-tokens, a prefill worker chosen by --policy prefills
it (do_remote_decode), storing its blocks in kvstrata, and the decode
worker, given the kv_transfer_params, loads them and streams the answer;
otherwise the decode worker prefills it itself.

KV events: with events=, the frontend connects to the worker's PUB
socket (vLLM binds tcp://*:5557 by default). With --kv-events-bind, the
frontend listens instead and workers' publishers connect to it (vLLM
connects when its kv-events endpoint is not a wildcard, e.g.
tcp://frontend:5557; kvstrata worker with --kv-events-connect): give each
such worker a distinct topic (vLLM's kv-events-config "topic", kvstrata
worker's --kv-events-topic) and list it as URL,topic=T[,replay=...]. The
replay socket is dialed either way.

Policies: kv-tiered (pool and cache tiers, the default), kv-hbm (pool
only), least-loaded, random, round-robin. A request overrides --policy,
--temperature, --overlap-weight, --busy-block-fraction and
--busy-prefill-tokens for itself with a "kvstrata" object, the flags' names
with underscores: {"kvstrata": {"policy": "kv-hbm", "temperature": 0.5}}; a
bad one is answered 400.`,
		Example: `  # A cache node, two sim workers and the frontend in front of them
  kvstrata serve &
  kvstrata worker --listen 127.0.0.1:8001 --kv-events tcp://127.0.0.1:5601 --kv-events-replay tcp://127.0.0.1:5602 &
  kvstrata worker --listen 127.0.0.1:8002 --kv-events tcp://127.0.0.1:5603 --kv-events-replay tcp://127.0.0.1:5604 &
  kvstrata frontend \
    --worker http://127.0.0.1:8001,events=tcp://127.0.0.1:5601,replay=tcp://127.0.0.1:5602 \
    --worker http://127.0.0.1:8002,events=tcp://127.0.0.1:5603,replay=tcp://127.0.0.1:5604
  curl -sN 127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \
    -d '{"model": "kvstrata-sim", "prompt": "Hello", "max_tokens": 8, "stream": true}'

  # Disaggregated: a prefill and a decode worker
  kvstrata worker --role prefill --listen 127.0.0.1:8001 --kv-events tcp://127.0.0.1:5601 &
  kvstrata worker --role decode --listen 127.0.0.1:8002 --kv-events tcp://127.0.0.1:5603 &
  kvstrata frontend --worker http://127.0.0.1:8001,events=tcp://127.0.0.1:5601,role=prefill \
    --worker http://127.0.0.1:8002,events=tcp://127.0.0.1:5603,role=decode`,
		Args: noArgs("frontend"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			probs := t.apply()
			probs = append(probs, proc.apply()...)
			for _, s := range specs {
				spec, err := parseWorkerSpec(s)
				if err != nil {
					probs = append(probs, fmt.Sprintf("--worker %q: %v", s, err))
				}
				fcfg.Workers = append(fcfg.Workers, spec)
			}
			if len(specs) == 0 && !fcfg.Discover {
				probs = append(probs, "--worker: at least one is needed, or --discover")
			}
			p, err := policy.ParsePolicy(policyName)
			if err != nil {
				probs = append(probs, fmt.Sprintf("--policy %q: %v", policyName, err))
			}
			fcfg.Policy.Policy = p
			model.EnsureDefaults()
			if ns, err := worker.Namespace(model); err != nil {
				probs = append(probs, configProblems(err)...)
			} else {
				fcfg.Namespace = ns
			}
			fcfg.Logger = proc.logger(stderr)
			fcfg.EnsureDefaults()
			if err := fcfg.Validate(); err != nil && fcfg.Namespace.Model != "" {
				msg := strings.TrimPrefix(err.Error(), frontend.ErrBadConfig.Error()+": ")
				probs = append(probs, strings.Split(msg, "; ")...)
			}
			if len(probs) > 0 {
				return usageError{fmt.Errorf("bad flags:\n  %s", strings.Join(probs, "\n  "))}
			}
			part := &frontendPart{cfg: fcfg, model: model, listen: listen, failed: make(chan error, 1)}
			r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: proc.shutdown, Logger: fcfg.Logger}, part)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	t.fs = fs
	t.str("listen", listen, "HTTP address of the OpenAI API, /health and /metrics", &listen)
	fs.StringArrayVar(&specs, "worker", nil, "a worker: URL[,events=tcp://host:port][,replay=tcp://host:port][,topic=T][,role=aggregated|prefill|decode] (repeat for each)")
	fs.BoolVar(&fcfg.Discover, "discover", false, "also route to the workers registered with the cache cluster at --cache (kvstrata worker --register), in their roles")
	t.duration("discover-interval", frontend.DefaultDiscoverInterval, "how often --discover lists the worker registry", &fcfg.DiscoverInterval)
	t.str("kv-events-bind", "", `ZMQ endpoint to listen on for workers' KV-event publishers that connect in, told apart by topic, e.g. tcp://0.0.0.0:5557 ("": none)`, &fcfg.EventsBind)
	t.str("cache", "127.0.0.1:7070", `gRPC address of a cache node asked where prompts' blocks are, per tier ("": none, no tier credit)`, &fcfg.Cache)
	t.duration("cache-timeout", frontend.DefaultCacheTimeout, "longest wait for the cache's answer; past it a request is routed without tier credit", &fcfg.CacheTimeout)
	t.str("policy", policy.KVTiered.String(), "routing policy: kv-tiered, kv-hbm, least-loaded, random or round-robin", &policyName)
	t.float("temperature", 0, "routing temperature: 0 picks the cheapest worker; higher spreads requests (relative to the spread of costs)", &fcfg.Policy.Temperature)
	t.float("overlap-weight", 1, "prefill work against decode load in a worker's cost: higher favours time to first token", &fcfg.Policy.OverlapWeight)
	t.int("max-migrations", frontend.DefaultMaxMigrations, "most moves of one request to another worker after a failure (negative: none)", &fcfg.MaxMigrations)
	t.int("queue-size", frontend.DefaultQueueSize, "most requests waiting while every worker is busy; past it, 503", &fcfg.QueueSize)
	t.duration("queue-wait", frontend.DefaultQueueWait, "longest wait in that queue; past it, 503", &fcfg.QueueWait)
	t.duration("health-interval", frontend.DefaultHealthInterval, "how often each worker's /health is asked", &fcfg.HealthInterval)
	t.int("disagg-min-uncached-tokens", frontend.DefaultDisaggMinUncached, "disaggregated: a prompt whose uncached part on its decode worker is at most this many tokens is prefilled there (negative: never)", &fcfg.DisaggMinUncached)
	addRoutingFlags(&t, &fcfg)
	t.str("model", model.Model, "the workers' model backend: sim or tiny", &model.Model)
	t.str("served-model-name", "", `the model name requests use and /v1/models lists (default "kvstrata-sim" or "kvstrata-tiny")`, &model.ModelName)
	t.int("token-bytes", model.TokenBytes, "sim: the workers' KV bytes per token per layer", &model.TokenBytes)
	t.uint64("tiny-seed", model.TinySeed, "tiny: the workers' weights seed", &model.TinySeed)
	t.str("tiny-weights", "", "tiny: the workers' safetensors weights file", &model.TinyWeights)
	t.int("num-gpu-blocks", 0, "the workers' pool in blocks, for the busy threshold (0: unknown, never busy by blocks)", &fcfg.WorkerBlocks)
	t.int("max-model-len", 0, "longest request, prompt plus max_tokens (0: the workers' default)", &model.ContextLen)
	proc.add(fs)
	return cmd
}

// parseWorkerSpec reads URL[,events=...][,replay=...][,topic=...][,role=...].
func parseWorkerSpec(s string) (frontend.WorkerSpec, error) {
	parts := strings.Split(s, ",")
	spec := frontend.WorkerSpec{URL: strings.TrimSuffix(parts[0], "/")}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok || v == "":
			return spec, fmt.Errorf("%q is not key=value", kv)
		case k == "events":
			spec.Events = v
		case k == "replay":
			spec.Replay = v
		case k == "topic":
			spec.Topic = v
		case k == "role":
			spec.Role = v
		default:
			return spec, fmt.Errorf("unknown key %q (events, replay, topic or role)", k)
		}
	}
	return spec, nil
}

// frontendPart is the frontend as a part of a process.
type frontendPart struct {
	cfg    frontend.Config
	model  worker.Config
	listen string
	failed chan error

	router *frontend.Router
	srv    *http.Server
	ln     net.Listener
	served chan struct{}
}

func (f *frontendPart) Name() string             { return "frontend" }
func (f *frontendPart) Failed() <-chan error     { return f.failed }
func (f *frontendPart) Ready() error             { return nil }
func (f *frontendPart) Addr() string             { return f.ln.Addr().String() }
func (f *frontendPart) Router() *frontend.Router { return f.router }

func (f *frontendPart) Start(ctx context.Context) (err error) {
	tok, err := tokenizer.O200k()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f.cfg.Registerer = reg
	if f.router, err = frontend.New(f.cfg); err != nil {
		return err
	}
	api, err := openai.New(openai.Config{Engine: f.router, Tokenizer: tok, ModelName: f.model.ModelName,
		ContextLen: f.model.ContextLen, StopTokens: f.model.StopTokens(), Gatherer: reg, Health: f.router.Ready, Logger: f.cfg.Logger})
	if err != nil {
		f.router.Close()
		return err
	}
	if f.ln, err = net.Listen("tcp", f.listen); err != nil {
		f.router.Close()
		return fmt.Errorf("frontend: listen on %s: %w", f.listen, err)
	}
	var guarded net.Listener
	f.srv, guarded = api.HTTPServer(f.ln)
	f.srv.ErrorLog = slog.NewLogLogger(f.cfg.Logger.Handler(), slog.LevelWarn)
	f.served = make(chan struct{})
	go func() {
		defer close(f.served)
		if err := f.srv.Serve(guarded); !errors.Is(err, http.ErrServerClosed) {
			f.failed <- fmt.Errorf("HTTP server on %s: %w", f.ln.Addr(), err)
		}
	}()
	var names []string
	for _, w := range f.cfg.Workers {
		if w.Role != "" && w.Role != frontend.RoleAggregated {
			names = append(names, w.URL+"("+w.Role+")")
			continue
		}
		names = append(names, w.URL)
	}
	f.cfg.Logger.Info("frontend serving", "http", f.Addr(), "kv_events_bind", orNone(f.router.EventsAddr()), "policy", f.cfg.Policy.Policy, "cache", orNone(f.cfg.Cache),
		"model", f.model.Model, "served_model_name", f.model.ModelName, "workers", strings.Join(names, " "))
	return nil
}

func (f *frontendPart) Stop(ctx context.Context) error {
	var errs []error
	if err := f.srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("HTTP shutdown: %w", err))
		f.srv.Close()
	}
	<-f.served
	if err := f.router.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

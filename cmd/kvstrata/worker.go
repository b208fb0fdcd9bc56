package main

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/gpu/gpustat"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvstrata/kvstrata/engine/worker"
	"github.com/kvstrata/kvstrata/internal/lifecycle"
)

// A worker is a part of a process.
var (
	_ lifecycle.Part    = (*worker.Worker)(nil)
	_ lifecycle.Checker = (*worker.Worker)(nil)
)

func newWorkerCommand(stderr io.Writer) *cobra.Command {
	cfg := worker.DefaultConfig()
	var t flagTable
	var proc processFlags
	reg := registration{ttl: DefaultRegisterTTL}
	var register bool
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run an inference worker (OpenAI API, vLLM's metrics and KV events) that uses a cache node",
		Long: `worker runs one inference worker until SIGINT or SIGTERM. From outside it looks
like vLLM: the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models,
/health) and /metrics with vLLM's metric names on --listen, vLLM's KV events
(ZMQ PUB, msgpack) on --kv-events. Inside, its engine keeps a block pool of
--num-gpu-blocks blocks of 16 tokens with prefix caching, onboards prompt
prefixes from the kvstrata node at --cache and offloads every full block it
computes there. A cache that is down or slow costs recomputation, never a
request.

The model is sim (costs time, not FLOPs: a profile of step times, Dynamo
mocker's by default, divided by --speedup) or tiny (a real small transformer
on the CPU, weights from --tiny-seed or --tiny-weights). Both tokenize with
o200k_base.

--role prefill serves every request as the prefill half of a disaggregated
request (as if it carried kv_transfer_params {"do_remote_decode": true}):
the prompt's blocks go to kvstrata and the response's kv_transfer_params
name them for a decode worker. The role is exported as
kvstrata_worker_info{role=...}.

--register records the worker in the worker registry of the cache cluster
at --cache (its URL, KV-event endpoints, role, model, namespace and pool),
with a lease of --register-ttl renewed three times per lease, so that
every 'kvstrata frontend --discover' replica routes to it. A clean
shutdown deregisters it first; a killed worker's lease ends by itself.

On SIGINT or SIGTERM the worker stops accepting, lets requests in flight
finish (up to --shutdown-timeout), sends its last KV events and exits 0.`,
		Example: `  # A sim worker on :8000 using the cache node at 127.0.0.1:7070
  kvstrata serve &
  kvstrata worker
  curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
    -d '{"model": "kvstrata-sim", "prompt": "Hello", "max_tokens": 8}'

  # The tiny transformer, no cache, no KV events, on another port
  kvstrata worker --model tiny --cache "" --kv-events "" --kv-events-replay "" --listen 127.0.0.1:8001

  # A disaggregated pair: a prefill worker and a decode worker sharing the cache
  kvstrata worker --role prefill --listen 127.0.0.1:8100 --kv-events tcp://127.0.0.1:5600 --kv-events-replay ""
  kvstrata worker --role decode --listen 127.0.0.1:8200 --kv-events tcp://127.0.0.1:5602 --kv-events-replay ""`,
		Args: noArgs("worker"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			probs := t.apply()
			probs = append(probs, proc.apply()...)
			cfg.EnsureDefaults()
			if err := cfg.Validate(); err != nil {
				probs = append(probs, configProblems(err)...)
			}
			if register {
				probs = append(probs, reg.check(cfg)...)
			}
			if len(probs) > 0 {
				return usageError{fmt.Errorf("bad flags:\n  %s", strings.Join(probs, "\n  "))}
			}
			cfg.Logger = proc.logger(stderr)
			if gpus, err := gpustat.Open(); err != nil {
				cfg.Logger.Info("no GPU metrics", "why", err)
			} else {
				defer gpus.Close()
				cfg.Collectors = append(cfg.Collectors, gpus)
			}
			w, err := worker.New(cfg)
			if err != nil {
				return usageError{err}
			}
			parts := []lifecycle.Part{w}
			if register {
				reg.w, reg.cache, reg.log = w, cfg.Cache, cfg.Logger
				parts = append(parts, &reg)
			}
			r, err := lifecycle.New(lifecycle.Config{ShutdownTimeout: proc.shutdown, Logger: cfg.Logger}, parts...)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	t.fs = fs
	t.str("role", cfg.Role, "aggregated, prefill (every request is prefilled for a decode worker, its blocks written to the cache) or decode", &cfg.Role)
	t.str("listen", cfg.Listen, "HTTP address of the OpenAI API, /health and /metrics", &cfg.Listen)
	t.str("cache", cfg.Cache, `gRPC address of the kvstrata node to onboard from and offload to ("": no cache)`, &cfg.Cache)
	t.str("kv-events", cfg.KVEvents, `ZMQ endpoint of the KV-event PUB socket, as vLLM's ("": no events)`, &cfg.KVEvents)
	t.str("kv-events-replay", cfg.KVEventsReplay, `ZMQ endpoint of the KV-event replay (ROUTER) socket ("": none)`, &cfg.KVEventsReplay)
	fs.BoolVar(&register, "register", false, "register the worker in the cache cluster's worker registry at --cache, for frontends that --discover")
	t.str("advertise-url", "", `the worker's OpenAI API URL in the registry ("": http:// and the --listen address)`, &reg.advertise)
	t.duration("register-ttl", reg.ttl, "the registration's lease: a worker killed without deregistering is listed this long at most", &reg.ttl)
	fs.BoolVar(&cfg.KVEventsConnect, "kv-events-connect", false, "connect the KV-event PUB socket to --kv-events (a frontend's --kv-events-bind) instead of listening on it")
	t.str("kv-events-topic", "", "topic of every KV-event message (a frontend with --kv-events-bind tells workers apart by it)", &cfg.KVEventsTopic)
	addModelFlags(&t, &cfg)
	proc.add(fs)
	return cmd
}

// addModelFlags binds the worker settings that `worker` and `up` share.
func addModelFlags(t *flagTable, cfg *worker.Config) {
	t.str("model", cfg.Model, "model backend: sim (a timing model) or tiny (a real small transformer on the CPU)", &cfg.Model)
	t.str("served-model-name", "", `the model name requests use and /v1/models lists (default "kvstrata-sim" or "kvstrata-tiny")`, &cfg.ModelName)
	t.str("kv-events-encoding", cfg.KVEventsEncoding, `KV-event encoding: arrays (vLLM's tagged arrays) or maps (with a "type" field)`, &cfg.KVEventsEncoding)
	t.str("sim-profile", "", "sim: profile file of prefill and decode step times (JSON; default: Dynamo mocker's polynomial)", &cfg.SimProfile)
	t.float("speedup", cfg.Speedup, "sim: divide every modelled step time by this (e.g. 10 for a replay ten times faster)", &cfg.Speedup)
	t.int("token-bytes", cfg.TokenBytes, "sim: KV bytes per token per layer (4 layers), a multiple of 4: the bytes that move through the cache", &cfg.TokenBytes)
	t.uint64("tiny-seed", cfg.TinySeed, "tiny: seed of the generated weights", &cfg.TinySeed)
	t.str("tiny-weights", "", "tiny: safetensors file of weights, instead of generated ones", &cfg.TinyWeights)
	t.int("num-gpu-blocks", cfg.Blocks, "blocks (of 16 tokens) of the worker's own KV pool, its GPU memory", &cfg.Blocks)
	t.int("max-num-seqs", 0, "most sequences in a batch (0: 256, vLLM's default)", &cfg.MaxNumSeqs)
	t.int("max-num-batched-tokens", 0, "most tokens computed per step, decode and prefill chunks together (0: 2048, or --max-num-seqs if larger)", &cfg.MaxNumBatchedTokens)
	t.int("max-model-len", 0, "longest request, prompt plus max_tokens, in tokens (0: the pool's tokens for sim, 4096 for tiny)", &cfg.ContextLen)
	t.int("max-connections", cfg.HTTP.MaxConns, "most HTTP connections at once; a new one displaces the one idle or stalled longest in its request, else is answered 503", &cfg.HTTP.MaxConns)
	t.duration("http-body-timeout", cfg.HTTP.BodyTimeout, "time to send a request body, plus a second per 64 KiB sent; a body not sent in time is answered 408", &cfg.HTTP.BodyTimeout)
	t.duration("http-idle-timeout", cfg.HTTP.IdleTimeout, "close a keep-alive HTTP connection idle this long", &cfg.HTTP.IdleTimeout)
}

// flagTable binds flags to settings as text, parsed after the whole
// command line is read, so that every bad value is reported at once.
type flagTable struct {
	fs    *pflag.FlagSet
	flags []tableFlag
}

type tableFlag struct {
	name string
	val  *textValue
	set  func(string) error
}

// textValue is a flag's text, and the type its help shows.
type textValue struct{ s, typ string }

func (v *textValue) String() string     { return v.s }
func (v *textValue) Set(s string) error { v.s = s; return nil }
func (v *textValue) Type() string       { return v.typ }

func (t *flagTable) add(name, typ, def, usage string, set func(string) error) {
	v := &textValue{def, typ}
	t.fs.Var(v, name, usage)
	t.flags = append(t.flags, tableFlag{name, v, set})
}

func (t *flagTable) str(name, def, usage string, p *string) {
	t.add(name, "string", def, usage, func(v string) error { *p = v; return nil })
}

func (t *flagTable) int(name string, def int, usage string, p *int) {
	t.add(name, "int", strconv.Itoa(def), usage, func(v string) (err error) {
		*p, err = strconv.Atoi(v)
		return err
	})
}

func (t *flagTable) uint64(name string, def uint64, usage string, p *uint64) {
	t.add(name, "uint", strconv.FormatUint(def, 10), usage, func(v string) (err error) {
		*p, err = strconv.ParseUint(v, 10, 64)
		return err
	})
}

func (t *flagTable) float(name string, def float64, usage string, p *float64) {
	t.add(name, "float", strconv.FormatFloat(def, 'g', -1, 64), usage, func(v string) (err error) {
		*p, err = strconv.ParseFloat(v, 64)
		return err
	})
}

func (t *flagTable) duration(name string, def time.Duration, usage string, p *time.Duration) {
	t.add(name, "duration", def.String(), usage, func(v string) (err error) {
		*p, err = time.ParseDuration(v)
		return err
	})
}

// apply parses every flag's value into its setting and returns a line per
// value that does not parse.
func (t *flagTable) apply() []string {
	var probs []string
	for _, f := range t.flags {
		if err := f.set(f.val.s); err != nil {
			if ne, ok := err.(*strconv.NumError); ok {
				err = ne.Err
			}
			probs = append(probs, fmt.Sprintf("--%s %q: %v", f.name, f.val.s, err))
		}
	}
	return probs
}

// processFlags are a worker process's logging and shutdown flags.
type processFlags struct {
	t             flagTable
	level, format string
	shutdown      time.Duration
	parsedLevel   slog.Level
}

func (p *processFlags) add(fs *pflag.FlagSet) {
	p.t.fs = fs
	p.t.str("log-level", "info", "debug, info, warn or error", &p.level)
	p.t.str("log-format", "text", "text or json", &p.format)
	p.t.duration("shutdown-timeout", lifecycle.DefaultShutdownTimeout, "how long a shutdown waits for requests in flight", &p.shutdown)
}

func (p *processFlags) apply() []string {
	probs := p.t.apply()
	if err := p.parsedLevel.UnmarshalText([]byte(p.level)); err != nil {
		probs = append(probs, fmt.Sprintf("--log-level %q: debug, info, warn or error", p.level))
	}
	if p.format != "text" && p.format != "json" {
		probs = append(probs, fmt.Sprintf("--log-format %q: text or json", p.format))
	}
	if p.shutdown < 0 {
		probs = append(probs, fmt.Sprintf("--shutdown-timeout %v: must not be negative", p.shutdown))
	}
	return probs
}

func (p *processFlags) logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: p.parsedLevel}
	if p.format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// configProblems splits a worker config error into one line per problem.
func configProblems(err error) []string {
	msg := strings.TrimPrefix(err.Error(), worker.ErrBadConfig.Error()+": ")
	return strings.Split(msg, "; ")
}

func noArgs(name string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Errorf("%s takes no arguments, got %q", name, args)}
		}
		return nil
	}
}

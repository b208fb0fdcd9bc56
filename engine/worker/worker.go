// Package worker is one inference worker's parts wired together: the
// tokenizer (o200k, loaded once per process and shared), the model (sim
// or tiny), the connector to kvstrata (engine/kvconn), the KV-event
// publisher (engine/kvevents), the engine loop (engine/sched) and the
// OpenAI-compatible HTTP API (engine/openai) on its own listener, with
// the worker's own Prometheus registry — the engine's and the connector's
// metrics, Go and process collectors, and kvstrata_worker_info, which
// tells a router or a planner the worker's role.
//
// A Worker is a part of a process as internal/lifecycle runs parts: Start
// brings it up, Failed reports its HTTP server stopping on its own, Stop
// takes it down (HTTP drained within the context's deadline, then the
// engine, the event sink drained, the publisher, the connector). Drain,
// before Stop, takes it out of service losing nothing it computed: new
// requests get 503, the ones it has finish, its offloads reach the cache
// (drain.go). `kvstrata worker` runs one; `kvstrata up` runs several
// beside a cache node.
//
// Name, Failed, Addr, Ready, Registry and Drain are safe for concurrent
// use; Start and Stop are called once each, Drain and Stop only after a
// Start that succeeded.
package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvstrata/kvstrata/engine/kvconn"
	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/openai"
	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
	"github.com/kvstrata/kvstrata/index"
)

// The engine's parts fit one another.
var (
	_ openai.Engine   = (*sched.Engine)(nil)
	_ sched.Connector = (*kvconn.Conn)(nil)
	_ sched.EventSink = (*kvevents.PoolSink)(nil)
)

// ErrNotServing is what Ready and /health say before Start has finished and
// once Stop has begun.
var ErrNotServing = errors.New("worker: not serving")

// Worker is one worker process's parts.
type Worker struct {
	cfg  Config
	name string
	log  *slog.Logger

	serving atomic.Bool
	failed  chan error

	// Set by Start.
	reg    *prometheus.Registry
	model  model.Model
	engine *sched.Engine
	conn   *kvconn.Conn
	pub    *kvevents.Publisher
	sink   *kvevents.PoolSink
	srv    *http.Server
	ln     net.Listener
	served chan struct{} // closed when the HTTP server's Serve returns
	gate   *gate         // turns requests away once Drain began (drain.go)
}

// New returns a worker of cfg, its zero fields defaulted (see
// Config.EnsureDefaults), not started. Errors wrap ErrBadConfig.
func New(cfg Config) (*Worker, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("worker %s (%s)", cfg.Listen, cfg.Role)
	return &Worker{cfg: cfg, name: name, log: cfg.Logger.With("worker", cfg.Listen), failed: make(chan error, 1)}, nil
}

// Name names the part: its HTTP address and role.
func (w *Worker) Name() string { return w.name }

// Failed yields an error if the HTTP server stops serving on its own.
func (w *Worker) Failed() <-chan error { return w.failed }

// Ready is nil while the worker serves: started, not draining and not
// stopping.
func (w *Worker) Ready() error {
	if !w.serving.Load() {
		return ErrNotServing
	}
	if w.gate.closed() {
		return ErrDraining
	}
	return nil
}

// Config is the worker's configuration, defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Addr is where the HTTP server listens, once Start has returned nil (with
// the port chosen, for a Listen of port 0).
func (w *Worker) Addr() string { return w.ln.Addr().String() }

// Registry is the worker's metrics registry, once Start has returned nil.
func (w *Worker) Registry() *prometheus.Registry { return w.reg }

// KVEventsAddrs are where the KV-event publisher and its replay socket
// listen (with the ports chosen, for port 0), once Start has returned
// nil; "" for those the worker has not.
func (w *Worker) KVEventsAddrs() (events, replay string) {
	if w.pub == nil {
		return "", ""
	}
	return w.pub.Addr(), w.pub.ReplayAddr()
}

// Model is the worker's model, once Start has returned nil.
func (w *Worker) Model() model.Model { return w.model }

// Start builds the worker's parts and starts serving HTTP; if a step
// fails, it closes what it opened, in reverse, and says which step.
func (w *Worker) Start(ctx context.Context) (err error) {
	cfg := w.cfg
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	tok, err := tokenizer.O200k()
	if err != nil {
		return err
	}
	if w.model, err = newModel(cfg); err != nil {
		return err
	}
	w.reg = prometheus.NewRegistry()
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvstrata_worker_info",
		Help: "The worker's role (aggregated, prefill, decode) and model backend (sim, tiny); always 1.",
	}, []string{"model_name", "role", "backend"})
	info.WithLabelValues(cfg.ModelName, cfg.Role, cfg.Model).Set(1)
	// vLLM's cache_config_info, whose labels tell a profiler or a planner
	// the KV pool's size: num_gpu_blocks blocks of block_size tokens.
	cacheInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig",
	}, []string{"block_size", "num_gpu_blocks"})
	cacheInfo.WithLabelValues(strconv.Itoa(blockTokens), strconv.Itoa(cfg.Blocks)).Set(1)
	w.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), info, cacheInfo)
	for _, c := range cfg.Collectors {
		if err := w.reg.Register(c); err != nil {
			return fmt.Errorf("worker: metrics: %w", err)
		}
	}

	scfg := sched.Config{
		Model: w.model, Blocks: cfg.Blocks, MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		ContextLen: cfg.ContextLen, Registerer: w.reg, ModelName: cfg.ModelName, Logger: w.log,
	}
	if cfg.Cache != "" {
		w.conn, err = kvconn.New(ctx, kvconn.Config{Addr: cfg.Cache, Registerer: w.reg, ModelName: cfg.ModelName, Logger: w.log})
		if err != nil {
			return fmt.Errorf("worker: cache %s: %w", cfg.Cache, err)
		}
		undo = append(undo, func() { w.conn.Close() })
		scfg.Connector = w.conn
	}
	if cfg.KVEvents != "" {
		enc, _ := kvevents.ParseEncoding(cfg.KVEventsEncoding) // validated
		w.pub, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: cfg.KVEvents, ReplayEndpoint: cfg.KVEventsReplay, Encoding: enc,
			Connect: cfg.KVEventsConnect, Topic: cfg.KVEventsTopic})
		if err != nil {
			return fmt.Errorf("worker: KV events: %w", err)
		}
		undo = append(undo, func() { w.pub.Close() })
		if w.sink, err = kvevents.NewPoolSink(w.pub, kvevents.SinkConfig{}); err != nil {
			return fmt.Errorf("worker: KV events: %w", err)
		}
		undo = append(undo, func() { w.sink.Close() })
		scfg.Events = w.sink
	}
	if w.engine, err = sched.New(scfg); err != nil {
		return fmt.Errorf("worker: engine: %w", err)
	}
	undo = append(undo, w.engine.Close)

	var eng openai.Engine = w.engine
	if cfg.Role == RolePrefill {
		eng = prefillEngine{w.engine}
	}
	w.gate = &gate{Engine: eng}
	api, err := openai.New(openai.Config{
		Engine: w.gate, Tokenizer: tok, ModelName: cfg.ModelName, ContextLen: cfg.ContextLen, StopTokens: cfg.StopTokens(),
		Limits: cfg.HTTP, Gatherer: w.reg, Health: w.Ready, Logger: w.log,
	})
	if err != nil {
		return fmt.Errorf("worker: HTTP API: %w", err)
	}
	if w.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("worker: HTTP: listen on %s: %w", cfg.Listen, err)
	}
	var guarded net.Listener
	w.srv, guarded = api.HTTPServer(w.ln)
	w.srv.ErrorLog = slog.NewLogLogger(w.log.Handler(), slog.LevelWarn)
	w.served = make(chan struct{})
	go func() {
		defer close(w.served)
		if err := w.srv.Serve(guarded); !errors.Is(err, http.ErrServerClosed) {
			w.failed <- fmt.Errorf("HTTP server on %s: %w", w.ln.Addr(), err)
		}
	}()
	w.serving.Store(true)
	attrs := []any{"http", w.Addr(), "role", cfg.Role, "model", cfg.Model, "served_model_name", cfg.ModelName,
		"cache", orOff(cfg.Cache), "kv_events", orOff(cfg.KVEvents), "kv_events_replay", orOff(cfg.KVEventsReplay)}
	w.log.Info("worker serving", attrs...)
	return nil
}

func orOff(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

// Stop stops serving: /health turns 503, the HTTP server stops accepting
// and waits for requests in flight until ctx's deadline, then cuts them;
// then the engine closes (requests still in it end aborted), the event
// sink sends what it holds, and the publisher and the connector close.
func (w *Worker) Stop(ctx context.Context) error {
	w.serving.Store(false)
	var errs []error
	if err := w.srv.Shutdown(ctx); err != nil {
		// The deadline came with requests in flight: cut them.
		errs = append(errs, fmt.Errorf("HTTP shutdown: %w", err))
		w.srv.Close()
	}
	w.engine.Close()
	<-w.served
	if w.sink != nil {
		if err := w.sink.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := w.pub.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if w.conn != nil {
		if err := w.conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tinyEOS is o200k's <|endoftext|>, the tiny model's end of sequence.
const tinyEOS = 199999

// StopTokens are the end-of-sequence token ids of c's model: tiny's
// <|endoftext|>, none for sim.
func (c *Config) StopTokens() []uint32 {
	if c.Model == ModelTiny {
		return []uint32{tinyEOS}
	}
	return nil
}

// Namespace is the block namespace of the workers of c's model (backend,
// weights, KV layout): what a router hashes their prompts in. It builds
// the model to know it (for tiny, generates or reads its weights).
func Namespace(c Config) (index.Namespace, error) {
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return index.Namespace{}, err
	}
	m, err := newModel(c)
	if err != nil {
		return index.Namespace{}, err
	}
	return m.Layout().Namespace, nil
}

// newModel builds cfg's model backend.
func newModel(cfg Config) (model.Model, error) {
	switch cfg.Model {
	case ModelTiny:
		digest := ""
		if cfg.TinyWeights != "" {
			d, err := fileDigest(cfg.TinyWeights)
			if err != nil {
				return nil, fmt.Errorf("worker: tiny weights: %w", err)
			}
			digest = d
		}
		m, err := tiny.New(tiny.Config{Model: cfg.namespaceModel(digest), Vocab: tokenizer.O200kVocab, BlockTokens: blockTokens,
			ContextLen: cfg.ContextLen, Seed: cfg.TinySeed, Weights: cfg.TinyWeights})
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		return m, nil
	default:
		scfg := sim.Config{Model: cfg.namespaceModel(""), TokenBytes: cfg.TokenBytes, BlockTokens: blockTokens,
			Capacity: cfg.Blocks * blockTokens, Speedup: cfg.Speedup, Sleep: cfg.SimSleep}
		if cfg.SimProfile != "" {
			p, err := sim.ReadProfile(cfg.SimProfile)
			if err != nil {
				return nil, fmt.Errorf("worker: %w", err)
			}
			scfg.Profile = &p
		}
		m, err := sim.New(scfg)
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		return m, nil
	}
}

// fileDigest is the first 16 hex digits of the SHA-256 of a file.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// prefillEngine is a prefill worker's engine: every request that carries
// no kv_transfer_params is served as a prefill for a remote decode.
type prefillEngine struct{ *sched.Engine }

func (e prefillEngine) Generate(ctx context.Context, r sched.Request) (<-chan sched.Output, error) {
	if r.Transfer == nil {
		r.Transfer = &sched.KVTransferParams{DoRemoteDecode: true}
	}
	return e.Engine.Generate(ctx, r)
}

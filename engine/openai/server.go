// Package openai is a worker's OpenAI-compatible HTTP API, as vLLM serves
// it: POST /v1/completions and /v1/chat/completions (streamed as
// server-sent events or not), GET /v1/models, /health, /version and
// /metrics. Request and response fields, defaults, streaming chunks and
// error bodies follow vLLM's OpenAI server, so a router or client written
// for vLLM drives this worker unchanged.
//
// A Server is an http.Handler safe for concurrent use. Each prompt of a
// request is one Engine.Generate call under the HTTP request's context:
// a client that goes away cancels its engine requests. Bad input is
// answered with a 4xx before anything reaches the engine.
//
// HTTPServer serves a Server on a listener within its Limits: how many
// connections, how long headers, a body and idleness may take, and how
// long a response may wait for a client that stopped reading — so that
// stalled or slow clients hold nothing for long and lock no one out.
package openai

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvstrata/kvstrata/engine/sched"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
)

// Engine runs generation requests (sched.Engine is one).
type Engine interface {
	// Generate starts r; its Outputs arrive on the channel, closed after
	// the last. Cancelling ctx aborts the request.
	Generate(ctx context.Context, r sched.Request) (<-chan sched.Output, error)
}

// Defaults.
const (
	// DefaultMaxBodyBytes bounds a request body: 8 MiB, room for a
	// context-length prompt as text or token ids.
	DefaultMaxBodyBytes = 8 << 20
	// DefaultMaxBatchPrompts bounds the prompts of one completions request.
	DefaultMaxBatchPrompts = 256
	// defaultTemperature is vLLM's (and OpenAI's) default temperature.
	defaultTemperature = 1.0
	// defaultCompletionMaxTokens is /v1/completions' default max_tokens.
	defaultCompletionMaxTokens = 16
)

// ErrInvalidConfig is wrapped by Config.Validate's error.
var ErrInvalidConfig = errors.New("openai: invalid config")

// Config configures a Server. Engine, Tokenizer, ModelName and ContextLen
// are required; every other field has a default.
type Config struct {
	// Engine generates.
	Engine Engine
	// Tokenizer turns prompts into token ids and output ids into text.
	Tokenizer tokenizer.Tokenizer
	// ModelName is the served model name: the id /v1/models lists and the
	// one a request's "model" must name (or leave empty).
	ModelName string
	// ContextLen is the model's maximum length in tokens (vLLM's
	// max_model_len): a request's prompt plus max_tokens must fit.
	ContextLen int
	// StopTokens are the model's end-of-sequence token ids: generation
	// stops on them unless a request sets ignore_eos. The default is none.
	StopTokens []uint32
	// ChatTemplate turns chat messages into the prompt text. The default
	// is ChatML.
	ChatTemplate func([]ChatTurn) string
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	// The default is DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxBatchPrompts bounds the prompts of one completions request. The
	// default is DefaultMaxBatchPrompts.
	MaxBatchPrompts int
	// Limits bound what clients' connections may hold: see Limits. Every
	// zero field has its default.
	Limits Limits
	// Gatherer is served at GET /metrics; nil serves no /metrics.
	Gatherer prometheus.Gatherer
	// Health is asked by GET /health: nil or a nil error answers 200, an
	// error 503. The default is always healthy.
	Health func() error
	// Version is what GET /version reports. The default is the main
	// module's version, or "dev".
	Version string
	// Created is the model's creation time /v1/models reports. The default
	// is the time New is called.
	Created time.Time
	// Logger receives failed requests. The default is slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults replaces the zero value of every optional field with its
// default. It leaves invalid values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.ChatTemplate == nil {
		c.ChatTemplate = ChatML
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxBatchPrompts == 0 {
		c.MaxBatchPrompts = DefaultMaxBatchPrompts
	}
	c.Limits.EnsureDefaults()
	if c.Version == "" {
		c.Version = buildVersion()
	}
	if c.Created.IsZero() {
		c.Created = time.Now()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem of c in one error wrapping
// ErrInvalidConfig. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if c.Engine == nil {
		bad("engine is nil")
	}
	if c.Tokenizer == nil {
		bad("tokenizer is nil")
	} else {
		for _, id := range c.StopTokens {
			if int64(id) >= int64(c.Tokenizer.VocabSize()) {
				bad("stop token %d is outside the vocabulary (size %d)", id, c.Tokenizer.VocabSize())
			}
		}
	}
	if c.ModelName == "" {
		bad("model name is empty")
	}
	if c.ContextLen < 2 {
		bad("context length is %d, must be at least 2", c.ContextLen)
	}
	if c.MaxBodyBytes <= 0 {
		bad("max body bytes is %d, must be > 0", c.MaxBodyBytes)
	}
	if c.MaxBatchPrompts <= 0 {
		bad("max batch prompts is %d, must be > 0", c.MaxBatchPrompts)
	}
	probs = append(probs, c.Limits.Problems()...)
	if c.ChatTemplate == nil {
		bad("chat template is nil")
	}
	if c.Logger == nil {
		bad("logger is nil")
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(probs, "; "))
}

// Server serves the OpenAI API.
type Server struct {
	cfg     Config
	guard   *guard
	metrics http.Handler
	routes  map[string]route
}

type route struct {
	method string
	handle func(http.ResponseWriter, *http.Request)
}

// New returns a Server for cfg, defaults applied.
func New(cfg Config) (*Server, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, guard: newGuard(cfg.Limits)}
	s.routes = map[string]route{
		"/v1/completions":      {http.MethodPost, s.completions},
		"/v1/chat/completions": {http.MethodPost, s.chat},
		"/v1/models":           {http.MethodGet, s.models},
		"/health":              {http.MethodGet, s.health},
		"/version":             {http.MethodGet, s.version},
	}
	if cfg.Gatherer != nil {
		s.metrics = promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})
		s.routes["/metrics"] = route{http.MethodGet, s.metrics.ServeHTTP}
	}
	return s, nil
}

// ServeHTTP routes a request: an unknown path is a 404, a known path with
// the wrong method a 405, both as JSON error bodies.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, ok := s.routes[r.URL.Path]
	if !ok || rt.method != http.MethodPost || r.Method != http.MethodPost {
		s.guard.serving(r) // no body to read: the request is here
	}
	if !ok {
		writeError(w, httpError(http.StatusNotFound, "Not Found: %s", r.URL.Path))
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", rt.method)
		writeError(w, httpError(http.StatusMethodNotAllowed, "Method Not Allowed: %s %s (allowed: %s)", r.Method, r.URL.Path, rt.method))
		return
	}
	rt.handle(w, r)
}

// readBody reads a request body up to MaxBodyBytes, within BodyTimeout
// plus a second per MinBodyRate bytes received: a body that misses its
// deadline is answered 408 and its connection closed. The read deadline is
// cleared once the body is read: the response may stream for long.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	defer s.guard.serving(r)
	lim := s.cfg.Limits
	rc := http.NewResponseController(w)
	start := time.Now()
	deadline := func(got int) time.Time {
		return start.Add(lim.BodyTimeout + time.Duration(float64(got)/float64(lim.MinBodyRate)*float64(time.Second)))
	}
	// A handler served without a deadline-capable connection (a test's
	// recorder) reads without one.
	_ = rc.SetReadDeadline(deadline(0))
	defer rc.SetReadDeadline(time.Time{})
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	// The announced length is the client's word: memory is taken as the
	// bytes arrive.
	buf := make([]byte, 0, min(max(r.ContentLength, 512), 64<<10))
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, s.bodyError(w, r, err, len(buf), time.Since(start))
		}
		if n > 0 {
			_ = rc.SetReadDeadline(deadline(len(buf)))
		}
	}
}

// bodyError is the answer to a body that could not be read.
func (s *Server) bodyError(w http.ResponseWriter, r *http.Request, err error, got int, took time.Duration) *apiError {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return httpError(http.StatusRequestEntityTooLarge, "the request body exceeds %d bytes", s.cfg.MaxBodyBytes)
	case isTimeout(err):
		w.Header().Set("Connection", "close")
		if gc := connOf(r); gc != nil && gc.isDisplaced() {
			return httpError(http.StatusServiceUnavailable, "the connection was closed to make room for another: the worker serves its maximum of %d connections and the request body was arriving too slowly (%d bytes in %v)", s.cfg.Limits.MaxConns, got, took.Round(time.Millisecond))
		}
		return httpError(http.StatusRequestTimeout, "the request body was not received in time: %d bytes in %v, allowed %v plus a second per %d bytes", got, took.Round(time.Millisecond), s.cfg.Limits.BodyTimeout, s.cfg.Limits.MinBodyRate)
	}
	return badRequest("", "reading the request body: %v", err)
}

// checkModel answers a 404 unless model is empty or the served name.
func (s *Server) checkModel(model string) *apiError {
	if model == "" || model == s.cfg.ModelName {
		return nil
	}
	return modelNotFound(model)
}

// checkLength checks a prompt of n tokens and its max_tokens against the
// context length, in vLLM's words, and returns the max_tokens to use: the
// request's, or else the rest of the context.
func (s *Server) checkLength(n int, maxTokens *int) (int, *apiError) {
	limit := s.cfg.ContextLen
	if n >= limit {
		return 0, badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, n)
	}
	if maxTokens == nil {
		return limit - n, nil
	}
	if *maxTokens > limit-n { // not n+max > limit: max may be near MaxInt
		return 0, badRequest("max_tokens", "'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", *maxTokens, limit, n, *maxTokens, limit, n)
	}
	return *maxTokens, nil
}

type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen int               `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	created := s.cfg.Created.Unix()
	card := modelCard{
		ID: s.cfg.ModelName, Object: "model", Created: created, OwnedBy: "kvstrata",
		Root: s.cfg.ModelName, MaxModelLen: s.cfg.ContextLen,
		Permission: []modelPermission{{
			ID: "modelperm-" + s.cfg.ModelName, Object: "model_permission", Created: created,
			AllowSampling: true, AllowView: true, Organization: "*",
		}},
	}
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", []modelCard{card}})
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Health != nil {
		if err := s.cfg.Health(); err != nil {
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: "unhealthy: " + err.Error()})
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version})
}

// ChatML is the default chat template: each message as
// "<|im_start|>{role}\n{content}<|im_end|>\n", then "<|im_start|>assistant\n"
// for the reply.
func ChatML(turns []ChatTurn) string {
	var b strings.Builder
	for _, t := range turns {
		b.WriteString("<|im_start|>")
		b.WriteString(t.Role)
		b.WriteByte('\n')
		b.WriteString(t.Content)
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

// newID is a response id: prefix and 32 random hex digits.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// randomSeed seeds a request that names no seed.
func randomSeed() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// buildVersion is the main module's version, or "dev".
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

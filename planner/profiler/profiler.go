// Package profiler measures an inference server before it is deployed and
// writes what it measured as a version-2 sim.Profile: the file the
// planner, the configurator and the sim engine all read.
//
// It speaks the OpenAI completions API over HTTP (streamed, with vLLM's
// stream_options.continuous_usage_stats), so it profiles a kvstrata worker
// (sim or tiny) or any vLLM-style server:
//
//   - prefill: time to first token against input length, one request at
//     a time with max_tokens 1, each prompt random (prompt token ids, or
//     random words where the server takes only text), so that nothing is
//     cached; the median of Reps requests per length.
//   - decode: inter-token latency against concurrency × context length.
//     The prompts are sent once first (max_tokens 1) so that their KV is
//     cached, then sent again as concurrency streams at once with
//     ignore_eos and max_tokens OutputTokens; the ITL of a stream is the
//     mean gap between its tokens after the Skip-th.
//
// The KV pool's size comes from the server's /metrics
// (vllm:cache_config_info, labels num_gpu_blocks and block_size) unless
// Config.KVTokens gives it. Fit turns the measurements into curves and
// WriteSVG draws them.
package profiler

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/engine/model/sim"
)

// Defaults of a Config.
const (
	DefaultMaxNumBatchedTokens = 2048
	DefaultOutputTokens        = 32
	DefaultSkip                = 8
	DefaultReps                = 3
	DefaultRequestTimeout      = 5 * time.Minute
	// DefaultVocab bounds the random prompt token ids: every common
	// tokenizer has at least this many tokens.
	DefaultVocab = 30000
)

// Prompt forms.
const (
	PromptsAuto   = "auto"   // token ids, or text if the server refuses them
	PromptsTokens = "tokens" // a list of token ids, as vLLM's completions API takes
	PromptsText   = "text"   // random words
)

// ErrBadConfig marks a Config Run refuses; ErrTarget a server that does
// not answer as an OpenAI-compatible one should.
var (
	ErrBadConfig = errors.New("profiler: bad config")
	ErrTarget    = errors.New("profiler: target")
)

// Config is what to sweep, and where.
type Config struct {
	// Target is the server's base URL, e.g. http://127.0.0.1:8000.
	Target string
	// Model is the model name requests carry; "" takes the first of the
	// server's /v1/models.
	Model string
	// ISLs are the prompt lengths of the prefill sweep, in tokens.
	ISLs []int
	// Concurrency and Contexts are the decode sweep: every concurrency
	// with every context length (tokens per sequence); a pair whose KV
	// does not fit the pool (or whose concurrency passes MaxNumSeqs) is
	// skipped and logged.
	Concurrency []int
	Contexts    []int
	// KVTokens is the server's KV pool in tokens; 0 reads it from
	// /metrics. BlockTokens likewise (0: from /metrics, else 16).
	KVTokens    int
	BlockTokens int
	// MaxNumSeqs is the server's batch limit, recorded in the profile
	// (0: unknown). MaxNumBatchedTokens is its step's token budget: longer
	// prompts are prefilled in chunks of it. The default is
	// DefaultMaxNumBatchedTokens, vLLM's and kvstrata's.
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	// OutputTokens is each decode stream's max_tokens, Skip the tokens
	// of it not measured (prefills of the other streams share the first
	// steps). The defaults are DefaultOutputTokens and DefaultSkip.
	OutputTokens, Skip int
	// Reps is the requests per prefill length, of which the median is
	// kept. The default is DefaultReps.
	Reps int
	// Speedup multiplies every measured time: a sim worker running
	// Speedup times faster than its profile is measured in its profile's
	// time. The default is 1.
	Speedup float64
	// Prompts is PromptsAuto (the default), PromptsTokens or PromptsText.
	Prompts string
	// Vocab bounds the random token ids; the default is DefaultVocab.
	Vocab int
	// RequestTimeout bounds each request; the default is
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Client sends the requests; nil: a new http.Client.
	Client *http.Client
	// Logger tells the sweep's progress; nil: slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults sets every zero field to its default.
func (c *Config) EnsureDefaults() {
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = DefaultOutputTokens
	}
	if c.Skip == 0 {
		c.Skip = DefaultSkip
	}
	if c.Reps == 0 {
		c.Reps = DefaultReps
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Prompts == "" {
		c.Prompts = PromptsAuto
	}
	if c.Vocab == 0 {
		c.Vocab = DefaultVocab
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.Client == nil {
		c.Client = &http.Client{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports every problem of c in one error wrapping ErrBadConfig.
func (c Config) Validate() error {
	var probs []string
	bad := func(f string, args ...any) { probs = append(probs, fmt.Sprintf(f, args...)) }
	if u, err := url.Parse(c.Target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("target %q is not an http:// or https:// URL", c.Target)
	}
	list := func(name string, vs []int, least int) {
		if len(vs) == 0 {
			bad("%s is empty", name)
		}
		for _, v := range vs {
			if v < least {
				bad("%s has %d, each must be ≥ %d", name, v, least)
			}
		}
	}
	list("ISLs", c.ISLs, 1)
	list("concurrency", c.Concurrency, 1)
	// A decode prompt is the context less the mean output measured.
	list("contexts", c.Contexts, c.offset()+16)
	for _, f := range []struct {
		name string
		v    int
	}{{"KV tokens", c.KVTokens}, {"block tokens", c.BlockTokens}, {"max num seqs", c.MaxNumSeqs}} {
		if f.v < 0 {
			bad("%s is %d, must be ≥ 1 (0: unknown)", f.name, f.v)
		}
	}
	if c.MaxNumBatchedTokens < 1 {
		bad("max num batched tokens is %d, must be ≥ 1", c.MaxNumBatchedTokens)
	}
	if c.Skip < 1 || c.OutputTokens < c.Skip+2 {
		bad("output tokens %d and skip %d: need skip ≥ 1 and output tokens ≥ skip + 2", c.OutputTokens, c.Skip)
	}
	if c.Reps < 1 {
		bad("reps is %d, must be ≥ 1", c.Reps)
	}
	if !(c.Speedup > 0) || c.Speedup > 1e6 {
		bad("speedup is %v, must be > 0", c.Speedup)
	}
	if c.Prompts != PromptsAuto && c.Prompts != PromptsTokens && c.Prompts != PromptsText {
		bad("prompts is %q, want auto, tokens or text", c.Prompts)
	}
	if c.Vocab < 1000 {
		bad("vocab is %d, must be ≥ 1000", c.Vocab)
	}
	if c.RequestTimeout <= 0 {
		bad("request timeout is %v, must be > 0", c.RequestTimeout)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrBadConfig, strings.Join(probs, "; "))
}

// offset is how many tokens shorter than its context a decode prompt is:
// the tokens output, on average, over the measured gaps (the step making
// token k reads the prompt and k−1 tokens).
func (c Config) offset() int { return (c.Skip + c.OutputTokens - 1) / 2 }

// Result is a sweep's profile and the checks of its long prompts.
type Result struct {
	Profile sim.Profile
	Checks  []Check
	// Skipped are the decode points not measured, and why.
	Skipped []string
}

// Run sweeps the server at cfg.Target and fits a profile to what it
// measured. Nothing is written; the caller writes the result.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	r := &runner{cfg: cfg, base: strings.TrimRight(cfg.Target, "/"), log: cfg.Logger}
	if err := r.discover(ctx); err != nil {
		return Result{}, err
	}
	sw, skipped, err := r.sweep(ctx)
	if err != nil {
		return Result{}, err
	}
	lim := sim.WorkerLimits{KVTokens: r.kv, BlockTokens: r.block, MaxNumSeqs: cfg.MaxNumSeqs, MaxNumBatchedTokens: cfg.MaxNumBatchedTokens}
	src := fmt.Sprintf("kvstrata profile %s (model %s, %s prompts, speedup %g) %s", r.base, r.model, r.prompts, cfg.Speedup,
		time.Now().UTC().Format(time.RFC3339))
	p, checks, err := Fit(sw, lim, src)
	if err != nil {
		return Result{}, err
	}
	for _, c := range checks {
		r.log.Info("long prompt checked against the fitted profile", "isl", c.ISL, "measured_ms", round(c.MeasuredMs),
			"predicted_ms", round(c.PredictedMs), "error", fmt.Sprintf("%+.1f%%", 100*c.Err()))
	}
	return Result{Profile: p, Checks: checks, Skipped: skipped}, nil
}

type runner struct {
	cfg       Config
	base      string
	log       *slog.Logger
	model     string
	prompts   string // tokens or text
	kv, block int
	// wordTokens is tokens per random word, measured, for text prompts.
	wordTokens float64
}

// discover finds the model name, the KV pool's size and the prompt form.
func (r *runner) discover(ctx context.Context) error {
	r.model = r.cfg.Model
	if r.model == "" {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		body, err := r.get(ctx, "/v1/models")
		if err != nil {
			return err
		}
		if err := json.Unmarshal(body, &models); err != nil || len(models.Data) == 0 {
			return fmt.Errorf("%w: %s/v1/models lists no model (%v); give the model's name", ErrTarget, r.base, err)
		}
		r.model = models.Data[0].ID
	}
	r.kv, r.block = r.cfg.KVTokens, r.cfg.BlockTokens
	if r.kv == 0 || r.block == 0 {
		body, err := r.get(ctx, "/metrics")
		if err != nil && r.kv == 0 {
			return fmt.Errorf("%w; or give the KV tokens", err)
		}
		blocks, size, ok := cacheConfig(body)
		switch {
		case ok && r.kv == 0:
			r.kv = blocks * size
			r.block = orInt(r.block, size)
		case ok:
			r.block = orInt(r.block, size)
		case r.kv == 0:
			return fmt.Errorf("%w: %s/metrics has no vllm:cache_config_info with num_gpu_blocks and block_size; give the KV tokens", ErrTarget, r.base)
		}
	}
	if r.block == 0 {
		r.block = 16
	}
	r.prompts = r.cfg.Prompts
	if r.prompts == PromptsAuto {
		r.prompts = PromptsTokens
		if _, err := r.stream(ctx, r.prompt(16), 1, false); err != nil {
			if !errors.Is(err, errRefused) {
				return err
			}
			r.log.Info("the server refuses token-id prompts: random words instead", "error", err)
			r.prompts = PromptsText
		}
	}
	if r.prompts == PromptsText {
		// Tokens per random word, from the server's own count.
		const words = 512
		s, err := r.stream(ctx, r.prompt(words), 1, false)
		if err != nil {
			return err
		}
		if s.promptTokens <= 0 {
			return fmt.Errorf("%w: the server reports no usage.prompt_tokens, so text prompts cannot be sized", ErrTarget)
		}
		r.wordTokens = float64(s.promptTokens) / words
	}
	r.log.Info("profiling", "target", r.base, "model", r.model, "kv_tokens", r.kv, "block_tokens", r.block, "prompts", r.prompts)
	return nil
}

// orInt is a if it is set, else b.
func orInt(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// cacheConfig reads num_gpu_blocks and block_size from the labels of
// vllm:cache_config_info in a Prometheus text exposition.
func cacheConfig(exposition []byte) (blocks, size int, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line, found := strings.CutPrefix(sc.Text(), "vllm:cache_config_info{")
		if !found {
			continue
		}
		labels, _, _ := strings.Cut(line, "}")
		for _, kv := range splitLabels(labels) {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.Atoi(strings.Trim(v, `"`))
			if err != nil {
				continue
			}
			switch strings.TrimSpace(k) {
			case "num_gpu_blocks":
				blocks = n
			case "block_size":
				size = n
			}
		}
		if blocks > 0 && size > 0 {
			return blocks, size, true
		}
	}
	return 0, 0, false
}

// splitLabels splits a label list at the commas outside quoted values.
func splitLabels(s string) []string {
	var out []string
	var quoted, esc bool
	start := 0
	for i, c := range s {
		switch {
		case esc:
			esc = false
		case c == '\\':
			esc = true
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// sweep measures every prefill length and decode point.
func (r *runner) sweep(ctx context.Context) (sim.Sweep, []string, error) {
	var sw sim.Sweep
	for _, isl := range r.cfg.ISLs {
		var ms []float64
		var actual int
		for range r.cfg.Reps {
			s, err := r.stream(ctx, r.prompt(r.units(isl)), 1, false)
			if err != nil {
				return sw, nil, fmt.Errorf("prefill of %d tokens: %w", isl, err)
			}
			if len(s.tokens) == 0 {
				return sw, nil, fmt.Errorf("%w: prefill of %d tokens: the stream carried no token", ErrTarget, isl)
			}
			ms = append(ms, r.ms(s.tokens[0]))
			actual = r.isl(isl, s)
		}
		slices.Sort(ms)
		med := ms[len(ms)/2]
		if len(ms)%2 == 0 {
			med = (ms[len(ms)/2-1] + med) / 2
		}
		sw.Prefill = append(sw.Prefill, sim.PrefillPoint{ISL: actual, TTFTMs: med})
		r.log.Info("prefill", "isl", actual, "ttft_ms", round(med))
	}
	var skipped []string
	for _, ctxLen := range r.cfg.Contexts {
		for _, c := range r.cfg.Concurrency {
			if why := r.fits(c, ctxLen); why != "" {
				skipped = append(skipped, why)
				r.log.Info("decode point skipped", "concurrency", c, "context", ctxLen, "why", why)
				continue
			}
			itl, err := r.decode(ctx, c, ctxLen)
			if err != nil {
				return sw, nil, fmt.Errorf("decode of %d streams of %d tokens: %w", c, ctxLen, err)
			}
			sw.Decode = append(sw.Decode, sim.DecodePoint{Concurrency: c, Context: ctxLen, ITLMs: itl})
			r.log.Info("decode", "concurrency", c, "context", ctxLen, "itl_ms", round(itl))
		}
	}
	return sw, skipped, nil
}

// fits says why c streams of ctxLen tokens cannot be measured, or "".
func (r *runner) fits(c, ctxLen int) string {
	if r.cfg.MaxNumSeqs > 0 && c > r.cfg.MaxNumSeqs {
		return fmt.Sprintf("concurrency %d × context %d: more streams than max_num_seqs %d", c, ctxLen, r.cfg.MaxNumSeqs)
	}
	// Each stream holds its prompt and output in whole blocks, and one
	// block may be partly used.
	per := (ctxLen - r.cfg.offset() + r.cfg.OutputTokens + 2*r.block - 1) / r.block * r.block
	if c*per > r.kv {
		return fmt.Sprintf("concurrency %d × context %d: needs %d KV tokens, the pool has %d", c, ctxLen, c*per, r.kv)
	}
	return ""
}

// decode measures the mean ITL of c streams with ctxLen tokens of context.
func (r *runner) decode(ctx context.Context, c, ctxLen int) (float64, error) {
	prompts := make([]any, c)
	for i := range prompts {
		prompts[i] = r.prompt(r.units(ctxLen - r.cfg.offset()))
	}
	// Warm: the prompts' KV is computed once and stays in the pool's cache.
	if err := r.all(c, func(i int) error {
		_, err := r.stream(ctx, prompts[i], 1, false)
		return err
	}); err != nil {
		return 0, fmt.Errorf("warming the prompts: %w", err)
	}
	var mu sync.Mutex
	var sum float64
	err := r.all(c, func(i int) error {
		s, err := r.stream(ctx, prompts[i], r.cfg.OutputTokens, true)
		if err != nil {
			return err
		}
		k := r.cfg.Skip
		if len(s.tokens) <= k {
			return fmt.Errorf("%w: a stream of max_tokens %d with ignore_eos carried %d tokens", ErrTarget, r.cfg.OutputTokens, len(s.tokens))
		}
		n := len(s.tokens)
		gap := r.ms(s.tokens[n-1]-s.tokens[k-1]) / float64(n-k)
		mu.Lock()
		sum += gap
		mu.Unlock()
		return nil
	})
	if err != nil {
		return 0, err
	}
	return sum / float64(c), nil
}

// all runs f(0..n-1) at once and returns their errors joined.
func (r *runner) all(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// units is how many prompt units (tokens or words) make tokens tokens.
func (r *runner) units(tokens int) int {
	if r.prompts == PromptsText {
		return max(1, int(float64(tokens)/r.wordTokens+0.5))
	}
	return tokens
}

// isl is a measured prompt's length: the server's count where it gives one.
func (r *runner) isl(want int, s streamed) int {
	if r.prompts == PromptsText && s.promptTokens > 0 {
		return s.promptTokens
	}
	return want
}

// prompt is n random token ids, or n random words.
func (r *runner) prompt(n int) any {
	if r.prompts == PromptsText {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[rand.N(len(words))])
		}
		return b.String()
	}
	ids := make([]int, n)
	for i := range ids {
		ids[i] = 100 + rand.N(r.cfg.Vocab-100)
	}
	return ids
}

// words are common English words, each one token in the usual tokenizers.
var words = strings.Fields(`time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car city
community name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air teacher force
education`)

// ms is a measured duration in the profile's milliseconds.
func (r *runner) ms(d time.Duration) float64 { return msOf(d) * r.cfg.Speedup }

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// errRefused marks a request the server answered with a 4xx.
var errRefused = errors.New("refused")

func (r *runner) get(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s: %w", ErrTarget, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("%w: GET %s%s: %s", ErrTarget, r.base, path, resp.Status)
	}
	return body, nil
}

// streamed is one streamed completion: the arrival of each token since
// the request was sent, and the prompt's tokens as the server counted.
type streamed struct {
	tokens       []time.Duration
	promptTokens int
}

// stream sends one streamed completion and times its tokens.
func (r *runner) stream(ctx context.Context, prompt any, maxTokens int, ignoreEOS bool) (streamed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	body, err := json.Marshal(map[string]any{
		"model": r.model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": ignoreEOS,
		"stream": true, "stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true},
	})
	if err != nil {
		return streamed{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return streamed{}, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return streamed{}, fmt.Errorf("%w: %w", ErrTarget, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		err := fmt.Errorf("%w: POST %s/v1/completions: %s: %s", ErrTarget, r.base, resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode >= 400 && resp.StatusCode < 500 {
			err = fmt.Errorf("%w (%w)", err, errRefused)
		}
		return streamed{}, err
	}
	var s streamed
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			break
		}
		at := time.Since(start)
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return s, fmt.Errorf("%w: a stream chunk is not JSON: %w", ErrTarget, err)
		}
		n := len(s.tokens)
		switch {
		case chunk.Usage != nil:
			s.promptTokens = chunk.Usage.PromptTokens
			n = max(n, chunk.Usage.CompletionTokens)
		case len(chunk.Choices) > 0:
			n++ // no usage per chunk: a chunk is a token
		}
		for len(s.tokens) < n {
			s.tokens = append(s.tokens, at)
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("%w: reading the stream: %w", ErrTarget, err)
	}
	return s, nil
}

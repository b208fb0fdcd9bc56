package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/planner/profiler"
)

func newProfileCommand(stdout, stderr io.Writer) *cobra.Command {
	var cfg profiler.Config
	var out, svg, level string
	var t flagTable
	cmd := &cobra.Command{
		Use:   "profile --target URL",
		Short: "Measure an inference server's prefill and decode times and write them as a profile",
		Long: `profile sweeps an OpenAI-compatible inference server (a kvstrata worker, sim or
tiny, or a vLLM-style server) and writes a version-2 profile: the file that
'kvstrata worker --sim-profile', the planner and the configurator read.

Prefill: for each --isl, --reps requests one at a time with max_tokens 1 and a
prompt of random token ids (random words where the server takes only text),
so that nothing is cached; the median time to first token is kept. Lengths up
to --max-num-batched-tokens become the profile's prefill step curve; longer
ones are prefilled in chunks, and the fitted profile's time for them is
checked against the measurement and printed.

Decode: for each --context and --concurrency, the prompts are sent once to
warm the server's prefix cache, then sent again as that many streams at once
with ignore_eos and max_tokens --output-tokens; the inter-token latency is
the mean gap between a stream's tokens after the --skip-th, averaged over the
streams. The decode step is fitted as a + b·p + c·p² + e·batch, p being the
batch's KV tokens over the pool's. A point whose KV does not fit the pool is
skipped.

The pool's size comes from the server's /metrics (vllm:cache_config_info,
labels num_gpu_blocks and block_size, as vLLM and kvstrata workers export
it), or from --kv-tokens.

--speedup S multiplies every measured time by S: a sim worker started with
--speedup S is profiled in its profile's own time, S times faster.

Nothing is written unless the whole sweep succeeds. Exit status 2: bad
flags, or a target that does not serve the OpenAI API.`,
		Example: `  # Profile a sim worker running ten times faster than its profile
  kvstrata worker --model sim --speedup 10 --cache "" --listen 127.0.0.1:8000 &
  kvstrata profile --target http://127.0.0.1:8000 --speedup 10 -o profile.json --svg profile.svg

  # A vLLM server, a smaller sweep
  kvstrata profile --target http://gpu-host:8000 --isl 512,2048,8192 --concurrency 1,8,32 --context 2048`,
		Args: noArgs("profile"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			probs := t.apply()
			if cfg.Target == "" {
				probs = append(probs, "--target is required: the server's base URL, e.g. http://127.0.0.1:8000")
			}
			switch level {
			case "debug", "info", "warn", "error":
			default:
				probs = append(probs, fmt.Sprintf("--log-level %q: want debug, info, warn or error", level))
			}
			for _, f := range []struct{ flag, path string }{{"-o", out}, {"--svg", svg}} {
				if f.path == "" {
					continue
				}
				if st, err := os.Stat(filepath.Dir(f.path)); err != nil || !st.IsDir() {
					probs = append(probs, fmt.Sprintf("%s %s: the directory %s does not exist", f.flag, f.path, filepath.Dir(f.path)))
				}
			}
			if out == "" {
				probs = append(probs, "-o is required: the profile file to write")
			}
			if len(probs) == 0 {
				cfg.EnsureDefaults()
				if err := cfg.Validate(); err != nil {
					probs = append(probs, strings.TrimPrefix(err.Error(), profiler.ErrBadConfig.Error()+": "))
				}
			}
			if len(probs) > 0 {
				return usageError{fmt.Errorf("bad flags:\n  %s", strings.Join(probs, "\n  "))}
			}
			var lv slog.Level
			lv.UnmarshalText([]byte(level))
			cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
			res, err := profiler.Run(cmd.Context(), cfg)
			if err != nil {
				if errors.Is(err, profiler.ErrBadConfig) || errors.Is(err, profiler.ErrTarget) {
					return usageError{err}
				}
				return err
			}
			data, err := res.Profile.Marshal()
			if err != nil {
				return err
			}
			var pic bytes.Buffer
			if svg != "" {
				if err := profiler.WriteSVG(&pic, res.Profile); err != nil {
					return err
				}
			}
			if err := writeFileAtomic(out, data); err != nil {
				return err
			}
			if svg != "" {
				if err := writeFileAtomic(svg, pic.Bytes()); err != nil {
					return err
				}
			}
			printProfile(stdout, res, out, svg)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	t.fs = fs
	t.str("target", "", "base URL of the OpenAI-compatible server to profile, e.g. http://127.0.0.1:8000 (required)", &cfg.Target)
	t.str("model", "", `model name the requests carry ("": the first of the server's /v1/models)`, &cfg.Model)
	t.ints("isl", []int{128, 512, 2048, 8192, 32768}, "prompt lengths of the prefill sweep, in tokens", &cfg.ISLs)
	t.ints("concurrency", []int{1, 2, 4, 8, 16, 32, 64}, "concurrent streams of the decode sweep", &cfg.Concurrency)
	t.ints("context", []int{1024, 4096, 16384}, "context lengths of the decode sweep, in tokens per stream", &cfg.Contexts)
	t.int("kv-tokens", 0, "the server's KV pool, in tokens (0: from its /metrics, vllm:cache_config_info)", &cfg.KVTokens)
	t.int("max-num-seqs", 0, "the server's batch limit, recorded in the profile (0: unknown); a larger concurrency is skipped", &cfg.MaxNumSeqs)
	t.int("max-num-batched-tokens", profiler.DefaultMaxNumBatchedTokens, "the server's tokens per step: longer prompts are prefilled in chunks of it", &cfg.MaxNumBatchedTokens)
	t.int("output-tokens", profiler.DefaultOutputTokens, "max_tokens of each decode stream", &cfg.OutputTokens)
	t.int("skip", profiler.DefaultSkip, "tokens of each decode stream not measured (the other streams' prefills share the first steps)", &cfg.Skip)
	t.int("reps", profiler.DefaultReps, "requests per prefill length; the median is kept", &cfg.Reps)
	t.float("speedup", 1, "multiply every measured time by this: the server is a sim worker running this many times faster than its profile", &cfg.Speedup)
	t.str("prompts", profiler.PromptsAuto, "prompt form: tokens (token ids, as vLLM takes them), text (random words) or auto (tokens, else text)", &cfg.Prompts)
	t.duration("request-timeout", profiler.DefaultRequestTimeout, "longest a request may take", &cfg.RequestTimeout)
	fs.StringVarP(&out, "output", "o", "profile.json", "profile file to write (JSON, profile format version 2)")
	fs.StringVar(&svg, "svg", "", `SVG picture of the measurements and the fitted curves to write ("": none)`)
	fs.StringVar(&level, "log-level", "info", "progress on stderr: debug, info, warn or error")
	return cmd
}

// ints binds a flag of comma-separated integers.
func (t *flagTable) ints(name string, def []int, usage string, p *[]int) {
	s := make([]string, len(def))
	for i, v := range def {
		s[i] = strconv.Itoa(v)
	}
	t.add(name, "ints", strings.Join(s, ","), usage, func(v string) error {
		var out []int
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				return fmt.Errorf("%q is not an integer", f)
			}
			out = append(out, n)
		}
		*p = out
		return nil
	})
}

// writeFileAtomic writes data to path through a temporary file in its
// directory, so that path is either the old file or the whole new one.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	return os.Rename(f.Name(), path)
}

func printProfile(w io.Writer, res profiler.Result, out, svg string) {
	p := res.Profile
	fmt.Fprintf(w, "profile written to %s", out)
	if svg != "" {
		fmt.Fprintf(w, ", picture to %s", svg)
	}
	fmt.Fprintf(w, "\nKV pool %d tokens, max_num_batched_tokens %d\n", p.Worker.KVTokens, p.Worker.MaxNumBatchedTokens)
	fmt.Fprintln(w, "prefill (batch 1):  ISL  TTFT ms")
	for _, pt := range p.Sweep.Prefill {
		fmt.Fprintf(w, "  %18d  %7.2f\n", pt.ISL, pt.TTFTMs)
	}
	for _, c := range res.Checks {
		fmt.Fprintf(w, "  ISL %d in chunks: the fitted profile says %.2f ms, measured %.2f ms (%+.1f %%)\n", c.ISL, c.PredictedMs, c.MeasuredMs, 100*c.Err())
	}
	fmt.Fprintln(w, "decode:  concurrency  context  ITL ms")
	for _, pt := range p.Sweep.Decode {
		fmt.Fprintf(w, "  %19d  %7d  %6.2f\n", pt.Concurrency, pt.Context, pt.ITLMs)
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(w, "  skipped: %s\n", s)
	}
	fmt.Fprintf(w, "decode step fitted: ms = %v (powers of p) + %.4f·batch, at least %.2f\n", p.Decode.Poly, p.Decode.PerSeqMs, p.Decode.MinMs)
}

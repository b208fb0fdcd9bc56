package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/replay"
	"github.com/kvstrata/kvstrata/replay/simulate"
	"github.com/kvstrata/kvstrata/trace"
)

// replayFlags are the flags of kvctl replay, as typed.
type replayFlags struct {
	target      string
	model       string
	speedup     float64
	maxRequests int
	duration    time.Duration
	concurrency int
	timeout     time.Duration
	seed        uint64
	vocab       int
	simulate    bool
	sim         simulateFlags
}

func (a *app) newReplayCommand() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay TRACE --target URL",
		Short: "Replay a request trace against a live deployment and report TTFT, ITL and E2E latency",
		Long: `replay sends the requests of a Mooncake JSONL trace to an OpenAI-compatible
server (a kvstrata worker or frontend, or vLLM) at the trace's times, and
reports what its users would see: time to first token (TTFT), inter-token
latency (ITL), end-to-end latency (E2E), throughput, and the share of prompt
tokens the server found cached.

Each request is a streamed /v1/completions with a prompt of token ids made
from its hash_ids: each hash id is 512 ids drawn from a generator seeded by
--seed and the id, so the same hash id is always the same tokens and the
prompts share exactly the prefixes the trace shares; the last block is cut to
input_length tokens. max_tokens is output_length, with ignore_eos, so every
request generates exactly that many tokens.

The schedule is open-loop: request i is sent at its timestamp divided by
--speedup whether or not earlier ones have finished. At most --concurrency
are outstanding; one whose time comes when that many are is sent as soon as
one ends, and counted as "waited for a slot".

ITL is measured between chunks with text; a chunk that carries k tokens (as
the continuous usage stats of vLLM and kvstrata workers tell) counts k
latencies of a k-th of its gap; extra tokens in the first chunk count in TTFT.
Prefix hits are usage.prompt_tokens_details.cached_tokens over prompt tokens,
in total: an OpenAI-compatible usage does not say which tier served them.

The report goes to stdout (-o json for the fields documented in the replay
package's Report), a progress bar to stderr when it is a terminal. Exit
status: 0 when every request completed; 1 when TRACE is missing or malformed,
a request cannot be replayed, or any request failed (the report is printed
first); 2 for a bad flag or value.`,
		Example: `  # The first 300 requests, ten times faster, against one worker
  kvctl replay testdata/traces/conversation_trace.jsonl --target http://127.0.0.1:8000 \
      --speedup 10 --max-requests 300

  # The first minute of the trace, as JSON
  kvctl replay trace.jsonl --target http://127.0.0.1:8000 --duration 1m -o json

  # Every routing policy in virtual time on 8 simulated workers with
  # kvstrata's cache, then random and kv-hbm again on workers without it
  kvctl replay trace.jsonl --simulate --workers 8 --speedup 1.2 --baseline random,kv-hbm

  # Workers sized while the trace runs, side by side: static at the peak and
  # at the mean load, the reactive baseline and the SLO planner; each row says
  # the share of requests within the targets and the worker-seconds
  kvctl replay trace.jsonl --simulate --router kv-tiered --parallel 2 \
      --scaler static-peak,static-mean,reactive,planner --slo-ttft 2s --slo-itl 60ms \
      --startup-delay 60s --scale-interval 30s --min-workers 1 --max-workers 16`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("replay takes one TRACE file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range simulateOnly {
				if cmd.Flags().Changed(name) {
					f.sim.given = append(f.sim.given, "--"+name)
				}
			}
			return a.runReplay(cmd.Context(), args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.target, "target", "", "base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (required)")
	fl.StringVar(&f.model, "model", "", `model name the requests carry ("": the server's own)`)
	fl.Float64Var(&f.speedup, "speedup", 1, "divide the trace's timestamps by this (10: ten times faster)")
	fl.IntVar(&f.maxRequests, "max-requests", 0, "replay only the first N requests of the trace (0: all)")
	fl.DurationVar(&f.duration, "duration", 0, "replay only the requests in this first part of the trace, in trace time before --speedup (0: all)")
	fl.IntVar(&f.concurrency, "concurrency", replay.DefaultMaxInFlight, "most requests outstanding at once")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long one request may take, to the end of its stream")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the prompts' tokens")
	fl.IntVar(&f.vocab, "vocab", replay.DefaultVocab, "token ids of the prompts are below this: o200k's vocabulary without its special tokens")
	fl.BoolVar(&f.simulate, "simulate", false, "replay in virtual time, in this process, against simulated workers, once per --router policy")
	f.sim.register(fl)
	return cmd
}

// check reports every problem of the flags at once as a usage error.
func (f replayFlags) check() (*replay.Target, error) {
	var probs []string
	if len(f.sim.given) > 0 {
		probs = append(probs, strings.Join(f.sim.given, ", ")+" need --simulate")
	}
	target, err := replay.NewTarget(f.target, f.model, nil, nil)
	switch {
	case f.simulate:
	case f.target == "":
		probs = append(probs, "--target is required")
	case err != nil:
		probs = append(probs, "--target: "+strings.TrimPrefix(err.Error(), "replay: "))
	}
	if !(f.speedup > 0) {
		probs = append(probs, fmt.Sprintf("--speedup is %v, must be > 0", f.speedup))
	}
	if f.maxRequests < 0 {
		probs = append(probs, fmt.Sprintf("--max-requests is %d, must be ≥ 0", f.maxRequests))
	}
	if f.duration < 0 {
		probs = append(probs, fmt.Sprintf("--duration is %v, must be ≥ 0", f.duration))
	}
	if f.concurrency < 1 {
		probs = append(probs, fmt.Sprintf("--concurrency is %d, must be ≥ 1", f.concurrency))
	}
	if f.timeout <= 0 {
		probs = append(probs, fmt.Sprintf("--timeout is %v, must be positive", f.timeout))
	}
	if f.vocab < 1 {
		probs = append(probs, fmt.Sprintf("--vocab is %d, must be ≥ 1", f.vocab))
	}
	if len(probs) > 0 {
		return nil, usageErrorf("replay: %s", strings.Join(probs, "; "))
	}
	return target, nil
}

// checkSimulate reports every problem of the flags of a simulated replay
// at once as a usage error.
func (f replayFlags) checkSimulate() (simulate.Config, error) {
	var probs []string
	if !(f.speedup > 0) {
		probs = append(probs, fmt.Sprintf("--speedup is %v, must be > 0", f.speedup))
	}
	if f.maxRequests < 0 {
		probs = append(probs, fmt.Sprintf("--max-requests is %d, must be ≥ 0", f.maxRequests))
	}
	if f.duration < 0 {
		probs = append(probs, fmt.Sprintf("--duration is %v, must be ≥ 0", f.duration))
	}
	if f.vocab < 1 {
		probs = append(probs, fmt.Sprintf("--vocab is %d, must be ≥ 1", f.vocab))
	}
	cfg, more := f.sim.config(f)
	probs = append(probs, more...)
	if len(probs) == 0 {
		cfg.EnsureDefaults()
		if err := cfg.Validate(); err != nil {
			probs = append(probs, strings.TrimPrefix(err.Error(), simulate.ErrConfig.Error()+": "))
		}
	}
	if len(probs) > 0 {
		return cfg, usageErrorf("replay: %s", strings.Join(probs, "; "))
	}
	return cfg, nil
}

// cut keeps the requests --max-requests and --duration ask for.
func (f replayFlags) cut(reqs []trace.Request) []trace.Request {
	if f.duration > 0 {
		kept := reqs[:0:0]
		for _, r := range reqs {
			if time.Duration(r.Timestamp)*time.Millisecond < f.duration {
				kept = append(kept, r)
			}
		}
		reqs = kept
	}
	if f.maxRequests > 0 && len(reqs) > f.maxRequests {
		reqs = reqs[:f.maxRequests]
	}
	return reqs
}

func (a *app) runReplay(ctx context.Context, path string, f replayFlags) error {
	if f.simulate {
		cfg, err := f.checkSimulate()
		if err != nil {
			return err
		}
		return a.runSimulate(ctx, path, f, cfg)
	}
	target, err := f.check()
	if err != nil {
		return err
	}
	all, err := trace.ReadFile(path)
	if err != nil {
		return err
	}
	reqs := f.cut(all)
	if len(reqs) == 0 {
		return fmt.Errorf("replay: %s has no request to replay (%d in the file)", path, len(all))
	}
	prompts := replay.Prompts{Vocab: f.vocab, Seed: f.seed}
	for i, r := range reqs {
		if err := prompts.Check(r); err != nil {
			return fmt.Errorf("%s: request %d: %w", path, i+1, err)
		}
	}

	cfg := replay.Config{Speedup: f.speedup, MaxInFlight: f.concurrency}
	var bar *progressbar.ProgressBar
	if a.interactive(a.stderr) {
		bar = progressbar.NewOptions(len(reqs), progressbar.OptionSetWriter(a.stderr),
			progressbar.OptionSetDescription("replaying"), progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("requests"), progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		cfg.Progress = func(done, _ int) { _ = bar.Set(done) }
	}
	rep, err := replay.Run(ctx, reqs, cfg, func(ctx context.Context, _ int, r trace.Request) replay.Result {
		ids, _ := prompts.Tokens(r) // checked above
		return target.Send(ctx, ids, r.OutputLength, f.timeout)
	})
	if bar != nil {
		_ = bar.Exit()
	}
	if err != nil && rep == nil {
		return err
	}
	if a.output == outputJSON {
		if werr := writeJSON(a.stdout, rep); werr != nil {
			return werr
		}
	} else {
		writeReplayTable(a, filepath.Base(path), f.target, rep)
	}
	switch {
	case err != nil:
		return fmt.Errorf("replay stopped after sending %d of %d requests: %w", rep.Sent, rep.Requests, err)
	case rep.Failed > 0:
		return fmt.Errorf("replay: %d of %d requests failed; first: %s", rep.Failed, rep.Sent, rep.FirstError)
	}
	return nil
}

// writeReplayTable writes rep for people: a latency table, then the counts.
func writeReplayTable(a *app, name, target string, rep *replay.Report) {
	w := a.stdout
	fmt.Fprintf(w, "%s: %d requests against %s at speedup %g, at most %d in flight\n\n",
		name, rep.Requests, target, rep.Speedup, rep.MaxInFlight)
	row := func(name string, l replay.Latency) []string {
		s := func(v float64) string { return formatLatency(time.Duration(v * float64(time.Second))) }
		return []string{name, s(l.Mean), s(l.P50), s(l.P90), s(l.P99), s(l.Max), fmt.Sprint(l.Count)}
	}
	_ = writeTable(w, []string{"LATENCY", "MEAN", "P50", "P90", "P99", "MAX", "SAMPLES"},
		[][]string{row("TTFT", rep.TTFT), row("ITL", rep.ITL), row("E2E", rep.E2E)})
	fmt.Fprintln(w)
	errs := "none"
	if len(rep.Errors) > 0 {
		var parts []string
		for _, k := range rep.ErrorKinds() {
			parts = append(parts, fmt.Sprintf("%s %d", k, rep.Errors[k]))
		}
		errs = strings.Join(parts, ", ")
	}
	_ = writeTable(w, []string{"RESULT", "VALUE"}, [][]string{
		{"requests", fmt.Sprintf("%d sent, %d completed, %d failed, %d waited for a slot", rep.Sent, rep.Completed, rep.Failed, rep.Waited)},
		{"duration", fmt.Sprintf("%.2fs", rep.DurationS)},
		{"throughput", fmt.Sprintf("%.2f requests/s, %.0f output tokens/s", rep.RequestsPerS, rep.OutputTokensPerS)},
		{"tokens", fmt.Sprintf("%d prompt, %d output (of %d asked)", rep.PromptTokens, rep.OutputTokens, rep.ExpectedOutputTokens)},
		{"prefix hits", fmt.Sprintf("%s of prompt tokens cached (%d; total of every tier, the target does not say which)",
			percent(rep.PrefixHitRate), rep.CachedTokens)},
		{"errors", errs},
	})
}

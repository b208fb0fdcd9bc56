package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/engine/model/sim"
	"github.com/kvstrata/kvstrata/planner/configure"
	"github.com/kvstrata/kvstrata/planner/perf"
	"github.com/kvstrata/kvstrata/trace"
)

type configureFlags struct {
	profile, tracePath, output, writeUp string
	budget, kvTokens                    int
	isl, osl, hit                       float64
	ttft, itl                           time.Duration
	seqs, batched                       []int
}

func newConfigureCommand(stdout io.Writer) *cobra.Command {
	f := configureFlags{output: "table",
		seqs: configure.DefaultMaxNumSeqs, batched: configure.DefaultMaxNumBatchedTokens}
	cmd := &cobra.Command{
		Use:   "configure --profile F --budget G (--isl N --osl N | --trace F) --slo-ttft D --slo-itl D",
		Short: "Recommend a deployment of workers for a budget, a load and latency targets",
		Long: `configure rates every deployment of --budget workers (GPUs) with the worker
profile: aggregated workers, and disaggregated prefill:decode pools at every
split p:(G−p), each with every pair of batch limits (--max-num-seqs ×
--max-num-batched-tokens). For each it finds λ_max, the highest request rate
the budget serves while the mean TTFT stays within --slo-ttft and the mean
ITL within --slo-itl, by bisection on planner/perf's model (the planner's and
the simulation's). From it:

  TOK/S/WORKER  λ_max × OSL ÷ G: output tokens a second per worker
  TOK/S/USER    1 ÷ ITL: one stream's speed at the concurrency each decode
                worker is run at (the largest that meets the ITL target)

It prints the Pareto front of those two (what the budget can buy: more
throughput or faster streams), and names the best configuration: the highest
throughput per worker; every point served at its λ_max meets both targets
by construction. -o json adds the best aggregated configuration and one it
rejected (other batch limits, the lowest λ_max) so a simulated replay can
check the ranking.

The load is the mean prompt and output lengths: --isl and --osl, or those
of a Mooncake JSONL --trace. --hit is the share of prompt tokens the cache
serves (0: every prompt prefilled whole).

--write-up FILE writes the best configuration as a ready-to-run script of
"kvstrata up" (sim workers with the profile and the limits).

Exit status: 0 on success; 1 when no configuration meets the targets (the
table says why) or a file cannot be read or written; 2 for a bad flag or
value.`,
		Example: `  kvstrata configure --profile profile.json --budget 8 --isl 4096 --osl 256 \
    --slo-ttft 500ms --slo-itl 30ms --write-up up.sh
  kvstrata configure --profile profile.json --budget 8 --trace conversation_trace.jsonl \
    --slo-ttft 2s --slo-itl 50ms -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runConfigure(cmd, stdout, f) },
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.profile, "profile", "", "the worker's profile: engine/model/sim JSON, as `kvstrata worker --sim-profile` reads (required)")
	fs.IntVar(&f.budget, "budget", 0, fmt.Sprintf("workers (GPUs) to deploy, in [1, %d] (required)", configure.MaxBudget))
	fs.Float64Var(&f.isl, "isl", 0, "mean prompt length, tokens (with --osl, instead of --trace)")
	fs.Float64Var(&f.osl, "osl", 0, "mean output length, tokens (with --isl)")
	fs.StringVar(&f.tracePath, "trace", "", "a Mooncake JSONL trace whose mean prompt and output lengths are the load (instead of --isl/--osl)")
	fs.Float64Var(&f.hit, "hit", 0, "share of prompt tokens the cache serves, in [0, 1)")
	fs.DurationVar(&f.ttft, "slo-ttft", 0, "mean time-to-first-token target, e.g. 500ms (required)")
	fs.DurationVar(&f.itl, "slo-itl", 0, "mean inter-token latency target, e.g. 30ms (required)")
	fs.IntVar(&f.kvTokens, "kv-tokens", 0, fmt.Sprintf("each worker's KV pool, tokens, a multiple of 16 (up's --num-gpu-blocks × 16; 0: the profile's worker's, else %d)", perf.DefaultKVTokens))
	fs.IntSliceVar(&f.seqs, "max-num-seqs", f.seqs, "max_num_seqs values to try, comma-separated")
	fs.IntSliceVar(&f.batched, "max-num-batched-tokens", f.batched, "max_num_batched_tokens values to try, comma-separated")
	fs.StringVarP(&f.output, "output", "o", f.output, "output format: table or json")
	fs.StringVar(&f.writeUp, "write-up", "", "write the best configuration as a `kvstrata up` script to this file")
	return cmd
}

// configureReport is configure's JSON output.
type configureReport struct {
	configure.Result
	// Up is the `kvstrata up` command line of the best configuration, and
	// of the best and rejected aggregated ones.
	Up           string `json:"up,omitempty"`
	UpAggregated string `json:"up_aggregated,omitempty"`
	UpRejected   string `json:"up_rejected,omitempty"`
}

func runConfigure(cmd *cobra.Command, stdout io.Writer, f configureFlags) error {
	var probs []string
	need := func(flag string, ok bool) {
		if !ok {
			probs = append(probs, "--"+flag+" is required")
		}
	}
	need("profile", f.profile != "")
	need("budget", cmd.Flags().Changed("budget"))
	need("slo-ttft", cmd.Flags().Changed("slo-ttft"))
	need("slo-itl", cmd.Flags().Changed("slo-itl"))
	byLengths := cmd.Flags().Changed("isl") || cmd.Flags().Changed("osl")
	switch {
	case byLengths && f.tracePath != "":
		probs = append(probs, "give either --isl and --osl or --trace")
	case !byLengths && f.tracePath == "":
		probs = append(probs, "give the load: --isl and --osl, or --trace")
	case byLengths && !(cmd.Flags().Changed("isl") && cmd.Flags().Changed("osl")):
		probs = append(probs, "--isl and --osl go together")
	}
	if f.output != "table" && f.output != "json" {
		probs = append(probs, fmt.Sprintf("-o %q: want table or json", f.output))
	}
	if f.kvTokens < 0 || f.kvTokens%16 != 0 {
		probs = append(probs, fmt.Sprintf("--kv-tokens %d: want a multiple of 16, ≥ 16 (0: the profile's)", f.kvTokens))
	}
	in := configure.Input{Budget: f.budget, ISL: f.isl, OSL: f.osl, Hit: f.hit, KVTokens: f.kvTokens,
		Targets: perf.Targets{TTFT: f.ttft, ITL: f.itl}, MaxNumSeqs: f.seqs, MaxNumBatchedTokens: f.batched}
	if f.profile != "" {
		p, err := sim.ReadProfile(f.profile)
		if err != nil {
			probs = append(probs, "--profile: "+err.Error())
		}
		in.Profile = p
	}
	if f.tracePath != "" && !byLengths {
		reqs, err := trace.ReadFile(f.tracePath)
		switch {
		case err != nil:
			probs = append(probs, "--trace: "+err.Error())
		case len(reqs) == 0:
			probs = append(probs, "--trace "+f.tracePath+": no request")
		default:
			for _, r := range reqs {
				in.ISL += float64(r.InputLength)
				in.OSL += float64(r.OutputLength)
			}
			in.ISL /= float64(len(reqs))
			in.OSL /= float64(len(reqs))
		}
	}
	if len(probs) == 0 {
		if err := in.Validate(); err != nil {
			probs = append(probs, err.Error())
		}
	}
	if len(probs) > 0 {
		return usageError{fmt.Errorf("configure: %s", strings.Join(probs, "; "))}
	}
	res, err := configure.Evaluate(in)
	if err != nil {
		return usageError{err}
	}
	profile, err := filepath.Abs(f.profile)
	if err != nil {
		return err
	}
	rep := configureReport{Result: res}
	if res.Best != nil {
		rep.Up = upCommand(*res.Best, profile, res.Input.KVTokens)
	}
	if res.BestAggregated != nil {
		rep.UpAggregated = upCommand(*res.BestAggregated, profile, res.Input.KVTokens)
	}
	if res.Rejected != nil {
		rep.UpRejected = upCommand(*res.Rejected, profile, res.Input.KVTokens)
	}
	if f.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writeConfigureTable(stdout, rep)
	}
	if res.Best == nil {
		return fmt.Errorf("configure: no configuration of %d workers meets TTFT %v and ITL %v at ISL %.0f, OSL %.0f (%s)",
			in.Budget, in.Targets.TTFT, in.Targets.ITL, in.ISL, in.OSL, res.Points[0].Reason)
	}
	if f.writeUp != "" {
		script := "#!/bin/sh\n# " + res.Best.String() + fmt.Sprintf(": %.3g requests/s within TTFT %v and ITL %v at ISL %.0f, OSL %.0f.\n",
			res.Best.Rate, in.Targets.TTFT, in.Targets.ITL, in.ISL, in.OSL) + "# Written by kvstrata configure; more flags of `kvstrata up` may follow on the command line.\nexec " + rep.Up + ` "$@"` + "\n"
		if err := os.WriteFile(f.writeUp, []byte(script), 0o755); err != nil {
			return fmt.Errorf("configure: --write-up: %w", err)
		}
	}
	return nil
}

// upCommand is the `kvstrata up` command line that runs p with sim
// workers of profile and a KV pool of kvTokens (in up's blocks of 16
// tokens, rounded down).
func upCommand(p configure.Point, profile string, kvTokens int) string {
	args := []string{"kvstrata", "up", "--model", "sim", "--sim-profile", shellQuote(profile)}
	if p.Mode == configure.Disaggregated {
		args = append(args, "--prefill", strconv.Itoa(p.Prefill), "--decode", strconv.Itoa(p.Decode))
	} else {
		args = append(args, "--workers", strconv.Itoa(p.Workers))
	}
	args = append(args, "--max-num-seqs", strconv.Itoa(p.MaxNumSeqs), "--max-num-batched-tokens", strconv.Itoa(p.MaxNumBatchedTokens),
		"--num-gpu-blocks", strconv.Itoa(kvTokens/16))
	return strings.Join(args, " ")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func writeConfigureTable(w io.Writer, rep configureReport) {
	in := rep.Input
	fmt.Fprintf(w, "%d workers, ISL %.0f, OSL %.0f, hit %.2f, targets TTFT %v ms and ITL %v ms, KV %d tokens a worker\n",
		in.Budget, in.ISL, in.OSL, in.Hit, in.TTFTMs, in.ITLMs, in.KVTokens)
	feasible := 0
	for _, p := range rep.Points {
		if p.Feasible() {
			feasible++
		}
	}
	fmt.Fprintf(w, "%d configurations rated, %d meet the targets; the Pareto front:\n\n", len(rep.Points), feasible)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tPREFILL:DECODE\tMAX SEQS\tMAX BATCHED\tλ_MAX REQ/S\tTOK/S/WORKER\tTOK/S/USER\tITL MS\tTTFT MS\tCONC\t")
	for _, p := range rep.Front {
		split := "-"
		if p.Mode == configure.Disaggregated {
			split = fmt.Sprintf("%d:%d", p.Prefill, p.Decode)
		}
		mark := ""
		if rep.Best != nil && p == *rep.Best {
			mark = "← best"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.3f\t%.1f\t%.1f\t%.2f\t%.1f\t%d\t%s\n", p.Mode, split, p.MaxNumSeqs, p.MaxNumBatchedTokens,
			p.Rate, p.ThroughputPerWorker, p.TokensPerUser, p.ITLMs, p.TTFTMs, p.Concurrency, mark)
	}
	tw.Flush()
	if rep.Best != nil {
		fmt.Fprintf(w, "\nbest: %s, %.3f requests/s\n  %s\n", rep.Best, rep.Best.Rate, rep.Up)
	}
	if rep.BestAggregated != nil && rep.BestAggregated != rep.Best {
		fmt.Fprintf(w, "best aggregated: %s, %.3f requests/s\n", rep.BestAggregated, rep.BestAggregated.Rate)
	}
	if rep.Rejected != nil {
		fmt.Fprintf(w, "rejected: %s, %.3f requests/s\n", rep.Rejected, rep.Rejected.Rate)
	}
}

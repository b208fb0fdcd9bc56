package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/trace"
)

type traceFlags struct {
	out         string
	curve       string
	duration    time.Duration
	meanRPS     float64
	maxRequests int
}

func (a *app) newTraceCommand() *cobra.Command {
	var f traceFlags
	cmd := &cobra.Command{
		Use:   "trace IN -o OUT --curve CURVE (--duration D | --mean-rps R)",
		Short: "Rescale a trace's timestamps to follow a rate curve",
		Long: `trace writes a copy of the Mooncake JSONL trace IN to OUT whose arrivals follow
a rate curve over a chosen duration: load steps, or a day-like cycle. Every
request keeps its prompt, output length and hash ids, and the requests their
order (the order of their timestamps, file order among equal ones); only the
timestamps change. Requests that arrived together still do.

The curve gives the relative rate over time; its scale comes from the
duration (--duration) or the mean request rate (--mean-rps: the duration is
then the number of requests ÷ R). Request i by timestamp arrives when the
curve's integral reaches the share of requests before it, so the arrivals in
any window follow the curve.

Curves:
  steps:R@T,R@T,…     rate R from T seconds on; the first T is 0
                      e.g. steps:0.25@0,1@300,0.5@600,0.25@900
  day:period=P[,min=M][,sharp=S]
                      min + (1−min)·((1 − cos 2πt/P)/2)^sharp: a trough at 0
                      and every P seconds, the peak (1) half a period later;
                      M in [0, 1] (default 0.1), S in (0, 100] (default 2)

With min 0.1 and sharp 2 the mean rate is 0.44 of the peak: a planner sized
for the mean and static provisioning at the peak differ by that much.

-o here names the output file (the trace written), not a format. A summary
line goes to stdout. Exit status: 0 on success, 1 when IN is missing or
malformed or OUT cannot be written, 2 for a bad flag or value.`,
		Example: `  # 4,000 conversation requests over 20 minutes, in four load steps
  kvctl trace conversation_trace.jsonl -o steps.jsonl --max-requests 4000 \
    --curve steps:0.25@0,1@300,0.5@600,0.25@900 --duration 1200s

  # a day-like cycle with a 10-minute period at 3 requests a second on average
  kvctl trace conversation_trace.jsonl -o day.jsonl --curve day:period=600 --mean-rps 3`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("trace takes one input TRACE file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runTrace(cmd, args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.out, "output", "o", "", "the trace file to write (required; overwritten)")
	fl.StringVar(&f.curve, "curve", "", "the rate curve: steps:R@SECONDS,… or day:period=SECONDS[,min=M][,sharp=S] (required)")
	fl.DurationVar(&f.duration, "duration", 0, "the length of the written trace, e.g. 1200s (give this or --mean-rps)")
	fl.Float64Var(&f.meanRPS, "mean-rps", 0, "the mean request rate of the written trace, requests a second (instead of --duration)")
	fl.IntVar(&f.maxRequests, "max-requests", 0, "rescale only the first N requests of IN, in file order (0: all)")
	return cmd
}

// check reports every problem of the flags at once.
func (f traceFlags) check(cmd *cobra.Command) (trace.Curve, error) {
	var probs []string
	if f.out == "" {
		probs = append(probs, "-o OUT is required")
	}
	var c trace.Curve
	if f.curve == "" {
		probs = append(probs, "--curve is required")
	} else {
		var err error
		if c, err = trace.ParseCurve(f.curve); err != nil {
			probs = append(probs, "--curve: "+err.Error())
		}
	}
	durSet, rpsSet := cmd.Flags().Changed("duration"), cmd.Flags().Changed("mean-rps")
	switch {
	case durSet == rpsSet:
		probs = append(probs, "give either --duration or --mean-rps")
	case durSet && (f.duration < trace.RescaleStep || f.duration > 1000*time.Hour):
		probs = append(probs, fmt.Sprintf("--duration %v: want [%v, 1000h]", f.duration, trace.RescaleStep))
	case rpsSet && !(f.meanRPS > 0 && f.meanRPS <= 1e6):
		probs = append(probs, fmt.Sprintf("--mean-rps %v: want requests a second in (0, 1e6]", f.meanRPS))
	}
	if f.maxRequests < 0 {
		probs = append(probs, fmt.Sprintf("--max-requests %d: want ≥ 0", f.maxRequests))
	}
	if len(probs) > 0 {
		return trace.Curve{}, usageErrorf("trace: %s", strings.Join(probs, "; "))
	}
	return c, nil
}

func (a *app) runTrace(cmd *cobra.Command, in string, f traceFlags) error {
	c, err := f.check(cmd)
	if err != nil {
		return err
	}
	if same(in, f.out) {
		return usageErrorf("trace: -o %s is the input trace; write to another file", f.out)
	}
	reqs, err := trace.ReadFile(in)
	if err != nil {
		return err
	}
	if f.maxRequests > 0 && len(reqs) > f.maxRequests {
		reqs = reqs[:f.maxRequests]
	}
	if len(reqs) == 0 {
		return fmt.Errorf("trace: %s has no request", in)
	}
	d := f.duration
	if f.meanRPS > 0 {
		d = time.Duration(math.Round(float64(len(reqs)) / f.meanRPS * float64(time.Second)))
		if d < trace.RescaleStep {
			return usageErrorf("trace: --mean-rps %v makes %d requests last %v, under %v", f.meanRPS, len(reqs), d, trace.RescaleStep)
		}
	}
	out, err := trace.Rescale(reqs, c, d)
	if err != nil {
		return err
	}
	// Written beside OUT and renamed over it, so a failure leaves OUT as
	// it was.
	tmp, err := os.CreateTemp(filepath.Dir(f.out), "."+filepath.Base(f.out)+".*")
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := trace.Write(tmp, out); err != nil {
		tmp.Close()
		return fmt.Errorf("trace: writing %s: %w", f.out, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("trace: writing %s: %w", f.out, err)
	}
	if err := os.Rename(tmp.Name(), f.out); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	fmt.Fprintf(a.stdout, "wrote %d requests to %s over %v (mean %.3g requests/s), curve %s\n",
		len(out), f.out, d, float64(len(out))/d.Seconds(), c)
	return nil
}

// same reports whether paths a and b name one existing file.
func same(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

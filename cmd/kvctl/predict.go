package main

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/planner/predict"
	"github.com/kvstrata/kvstrata/trace"
)

func (a *app) newPredictCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "predict",
		Short: "Load predictors of the planner, offline",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.newPredictBacktestCommand())
	return cmd
}

type backtestFlags struct {
	windows    []time.Duration
	predictors []string
	horizon    int
	warm       int
	season     time.Duration
}

func (a *app) newPredictBacktestCommand() *cobra.Command {
	f := backtestFlags{windows: []time.Duration{10 * time.Second, 60 * time.Second}, predictors: []string{"all"}, horizon: 1, warm: 10, season: 10 * time.Minute}
	cmd := &cobra.Command{
		Use:   "backtest TRACE…",
		Short: "Score each load predictor on the arrival rate of traces",
		Long: `backtest turns each Mooncake JSONL trace into its arrival rate, requests a
second in windows of each --window, feeds it to each predictor one window at
a time, and scores the prediction --horizon windows ahead against what came,
once the predictor has seen --warm windows:

  MAE    mean absolute error, requests/s
  RMSE   root mean square error, requests/s
  MAPE   mean absolute error relative to the actual rate (windows with
         arrivals only)
  UNDER  the share of windows predicted more than 10 % below the actual
         rate: those a planner would have under-provisioned

Predictors (--predictors, repeatable; "all" is every kind below with these
parameters):
  constant                        the last window's rate
  ma:N                            the mean of the last N windows (all: 6)
  holt:a,b                        Holt's level and trend (all: 0.5,0.1)
  kalman[:q_level,q_trend,r]      a Kalman filter on level and trend
  holt-winters:period=P[,a,b,g]   additive seasonal (all: P = --season ÷ window)
  arima | arima:p,d,q             ARIMA, order by KPSS and AIC, or fixed
                                  (all: arima and arima:1,1,1)

Exit status: 0 on success, 1 when a TRACE is missing or malformed, 2 for a
bad flag or value.`,
		Example: `  kvctl predict backtest ../shared/traces/*.jsonl --window 10s,60s --predictors all
  kvctl predict backtest steps.jsonl --predictors kalman --predictors holt:0.3,0.05 --horizon 3 -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("backtest takes one or more TRACE files")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return a.runBacktest(args, f) },
	}
	fl := cmd.Flags()
	fl.DurationSliceVar(&f.windows, "window", f.windows, "window lengths, comma-separated: the series' step")
	fl.StringArrayVar(&f.predictors, "predictors", f.predictors, `a predictor spec, or "all"; repeat the flag for more (specs hold commas)`)
	fl.IntVar(&f.horizon, "horizon", f.horizon, "predict this many windows ahead")
	fl.IntVar(&f.warm, "warm", f.warm, "windows each predictor sees before it is scored")
	fl.DurationVar(&f.season, "season", f.season, "the season holt-winters assumes in \"all\" (its period is this ÷ the window)")
	return cmd
}

// backtestRow is one line of the backtest; its JSON form is part of
// kvctl's interface.
type backtestRow struct {
	Trace     string  `json:"trace"`
	Window    string  `json:"window"`
	Points    int     `json:"points"`
	MeanRate  float64 `json:"mean_rate"`
	Predictor string  `json:"predictor"`
	predict.Score
}

func (a *app) runBacktest(paths []string, f backtestFlags) error {
	var probs []string
	for _, w := range f.windows {
		if w < time.Millisecond || w > 24*time.Hour {
			probs = append(probs, fmt.Sprintf("--window %v: want [1ms, 24h]", w))
		}
	}
	if len(f.windows) == 0 {
		probs = append(probs, "no --window given")
	}
	if f.horizon < 1 || f.horizon > 1000 {
		probs = append(probs, fmt.Sprintf("--horizon %d: want [1, 1000]", f.horizon))
	}
	if f.warm < 1 {
		probs = append(probs, fmt.Sprintf("--warm %d: want ≥ 1", f.warm))
	}
	if f.season <= 0 {
		probs = append(probs, fmt.Sprintf("--season %v: want > 0", f.season))
	}
	// Every spec is checked once up front; "all" depends on the window.
	for _, s := range f.predictors {
		if s == "all" {
			continue
		}
		if _, err := predict.New(s); err != nil {
			probs = append(probs, "--predictors: "+err.Error())
		}
	}
	if len(f.predictors) == 0 {
		probs = append(probs, "no --predictors given")
	}
	if len(probs) > 0 {
		return usageErrorf("predict backtest: %s", strings.Join(probs, "; "))
	}
	var rows []backtestRow
	for _, path := range paths {
		reqs, err := trace.ReadFile(path)
		if err != nil {
			return err
		}
		for _, w := range f.windows {
			series := predict.Series(reqs, w)
			var specs []string
			for _, s := range f.predictors {
				if s == "all" {
					specs = append(specs, predict.All(int(math.Round(f.season.Seconds()/w.Seconds())))...)
				} else {
					specs = append(specs, s)
				}
			}
			total := 0.0
			for _, v := range series {
				total += v
			}
			for _, spec := range slices.Compact(specs) {
				p, err := predict.New(spec)
				if err != nil {
					return usageErrorf("predict backtest: %v", err)
				}
				rows = append(rows, backtestRow{Trace: filepath.Base(path), Window: w.String(), Points: len(series),
					MeanRate: total / float64(max(len(series), 1)), Predictor: p.Name(), Score: predict.Backtest(p, series, f.warm, f.horizon)})
			}
		}
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, rows)
	}
	header := []string{"TRACE", "WINDOW", "POINTS", "MEAN REQ/S", "PREDICTOR", "MAE", "RMSE", "MAPE", "UNDER", "N"}
	var table [][]string
	for _, r := range rows {
		table = append(table, []string{r.Trace, r.Window, strconv.Itoa(r.Points), fmt.Sprintf("%.3f", r.MeanRate), r.Predictor,
			fmt.Sprintf("%.3f", r.MAE), fmt.Sprintf("%.3f", r.RMSE), percent(r.MAPE), percent(r.Under), strconv.Itoa(r.N)})
	}
	return writeTable(a.stdout, header, table)
}

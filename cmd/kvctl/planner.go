package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
)

func (a *app) newPlannerCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "planner {status | ack}",
		Short: "Show the planner's decisions in the cluster and acknowledge them",
		Long: `planner shows the scaling decisions that a planner with the virtual
connector (kvstrata planner --connector virtual), or in advisory mode,
recorded in the cache cluster's replicated state at --addr: each worker
pool's latest decision, and the last one an outside system acknowledged.

An outside system carries a decision out, then acknowledges it with
'kvctl planner ack POOL SEQ REPLICAS': the planner counts the pool as
REPLICAS workers from then on, and makes its next change of the pool only
after the ack (or after its ack timeout).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown planner command %q (want status or ack)", args[0])
			}
			return usageErrorf("planner needs a command: status or ack")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List each pool's latest decision and its acknowledgement (-o json for programs)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.runPlannerStatus(cmd.Context()) },
	}
	ack := &cobra.Command{
		Use:   "ack POOL SEQ REPLICAS",
		Short: "Acknowledge decision SEQ of POOL (aggregated, prefill or decode), carried out with REPLICAS workers running",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 3 {
				return usageErrorf("ack takes POOL SEQ REPLICAS, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return a.runPlannerAck(cmd.Context(), args) },
	}
	cmd.AddCommand(status, ack)
	return cmd
}

// plannerRow is one pool's record in kvctl's JSON output.
type plannerRow struct {
	Pool        string    `json:"pool"`
	Seq         uint64    `json:"seq"`
	Current     int64     `json:"current"`
	Target      int64     `json:"target"`
	Need        float64   `json:"need"`
	Reason      string    `json:"reason"`
	Mode        string    `json:"mode"`
	Applied     bool      `json:"applied"`
	At          time.Time `json:"at"`
	Planner     string    `json:"planner"`
	AckSeq      uint64    `json:"ack_seq"`
	AckReplicas int64     `json:"ack_replicas"`
}

func (a *app) runPlannerStatus(ctx context.Context) error {
	c, err := a.connect(ctx, client.Options{NoDataPlane: true})
	if err != nil {
		return err
	}
	ds, err := c.PlannerDecisions(ctx)
	if err != nil {
		return fmt.Errorf("planner status: %w", err)
	}
	rows := make([]plannerRow, len(ds))
	for i, d := range ds {
		rows[i] = plannerRow{Pool: d.Pool, Seq: d.Seq, Current: d.Current, Target: d.Target, Need: d.Need, Reason: d.Reason,
			Mode: d.Mode, Applied: d.Applied, At: time.UnixMilli(d.AtUnixMs).UTC(), Planner: d.Planner,
			AckSeq: d.AckSeq, AckReplicas: d.AckReplicas}
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, struct {
			Decisions []plannerRow `json:"decisions"`
		}{rows})
	}
	if len(rows) == 0 {
		fmt.Fprintln(a.stdout, "No planner decisions recorded.")
		return nil
	}
	var table [][]string
	for _, r := range rows {
		acked := "not yet"
		switch {
		case r.AckSeq == r.Seq:
			acked = fmt.Sprintf("%d running", r.AckReplicas)
		case r.AckSeq > 0:
			acked = fmt.Sprintf("#%d: %d running", r.AckSeq, r.AckReplicas)
		case r.Mode == "advisory": // asks nothing of anyone
			acked = "advice"
		}
		table = append(table, []string{r.Pool, "#" + strconv.FormatUint(r.Seq, 10),
			fmt.Sprintf("%d → %d", r.Current, r.Target), strconv.FormatFloat(r.Need, 'f', 2, 64), r.Reason, r.Mode,
			r.At.Local().Format(time.DateTime), acked})
	}
	return writeTable(a.stdout, []string{"POOL", "DECISION", "REPLICAS", "NEED", "REASON", "MODE", "AT", "ACKED"}, table)
}

func (a *app) runPlannerAck(ctx context.Context, args []string) error {
	pool := args[0]
	switch pool {
	case "aggregated", "prefill", "decode":
	default:
		return usageErrorf("pool %q: want aggregated, prefill or decode", pool)
	}
	seq, err := strconv.ParseUint(args[1], 10, 64)
	if err != nil || seq == 0 {
		return usageErrorf("SEQ %q: want the decision's number, a whole number ≥ 1 (kvctl planner status shows it)", args[1])
	}
	replicas, err := strconv.ParseInt(args[2], 10, 32)
	if err != nil || replicas < 0 {
		return usageErrorf("REPLICAS %q: want the workers the pool runs, a whole number ≥ 0", args[2])
	}
	c, err := a.connect(ctx, client.Options{NoDataPlane: true})
	if err != nil {
		return err
	}
	if err := c.AckPlannerDecision(ctx, pool, seq, replicas); err != nil {
		return fmt.Errorf("planner ack %s #%d: %w", pool, seq, err)
	}
	fmt.Fprintf(a.stdout, "Acknowledged %s decision #%d: %d running.\n", pool, seq, replicas)
	return nil
}

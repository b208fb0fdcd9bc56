package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
)

func (a *app) newClusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster {members | leader | join | remove}",
		Short: "Show and change the members of a cluster of cache nodes",
		Long: `cluster shows and changes the cluster the node at --addr belongs to: its
members, which node leads the Raft group that replicates the block
directory, and who is a voter. Nodes usually join themselves (kvstrata serve
--cluster-join ADDR); join and remove are for operators.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown cluster command %q (want members, leader, join or remove)", args[0])
			}
			return usageErrorf("cluster needs a command: members, leader, join or remove")
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	var yes bool
	var join joinFlags
	members := &cobra.Command{
		Use:   "members",
		Short: "List the members, their liveness, addresses and tiers",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.runMembers(cmd.Context()) },
	}
	leader := &cobra.Command{
		Use:   "leader",
		Short: "Show which node leads",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.runLeader(cmd.Context()) },
	}
	joinCmd := &cobra.Command{
		Use:   "join --id N --raft-addr HOST:PORT --grpc-addr HOST:PORT [--data-addr HOST:PORT]",
		Short: "Add a node to the cluster (a non-voter until it has caught up, then a voter)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return a.runJoin(cmd.Context(), join) },
	}
	joinCmd.Flags().Uint32Var(&join.id, "id", 0, "the node's id (required)")
	joinCmd.Flags().StringVar(&join.raft, "raft-addr", "", "the node's raft address (required)")
	joinCmd.Flags().StringVar(&join.grpc, "grpc-addr", "", "the node's gRPC address (required)")
	joinCmd.Flags().StringVar(&join.data, "data-addr", "", "the node's data-plane address")
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Take a node out of the cluster and its blocks out of the directory",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErrorf("remove takes one node id, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return a.runRemove(cmd.Context(), args[0], yes) },
	}
	remove.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.AddCommand(members, leader, joinCmd, remove)
	return cmd
}

type joinFlags struct {
	id               uint32
	raft, grpc, data string
}

// memberRow is one member in kvctl's JSON output.
type memberRow struct {
	ID        uint32       `json:"id"`
	Name      string       `json:"name"`
	Leader    bool         `json:"leader"`
	Voter     bool         `json:"voter"`
	Up        bool         `json:"up"`
	Since     *time.Time   `json:"since,omitempty"`
	GRPCAddr  string       `json:"grpc_addr"`
	DataAddr  string       `json:"data_addr"`
	RaftAddr  string       `json:"raft_addr"`
	Transport string       `json:"transport"`
	Tiers     []memberTier `json:"tiers,omitempty"`
	// TiersAt is when the node last reported its tiers to the cluster.
	TiersAt *time.Time `json:"tiers_at,omitempty"`
}

// memberTier is one tier of a member as the member reported it to the
// cluster with its heartbeat: only what the member record holds. (kvctl
// stats asks a node for the whole of its tiers: policy, hits, availability.)
type memberTier struct {
	Tier          string `json:"tier"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	UsedBytes     uint64 `json:"used_bytes"`
	Blocks        uint64 `json:"blocks"`
}

type membersOutput struct {
	Leader        uint32      `json:"leader_id"`
	DirectoryKeys uint64      `json:"directory_keys"`
	AppliedIndex  uint64      `json:"applied_index"`
	Members       []memberRow `json:"members"`
}

func (a *app) runMembers(ctx context.Context) error {
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	resp, err := c.Members(ctx)
	if err != nil {
		return fmt.Errorf("cluster members: %w", err)
	}
	out := membersOutput{Leader: resp.LeaderId, DirectoryKeys: resp.DirectoryKeys, AppliedIndex: resp.AppliedIndex}
	for _, m := range resp.Members {
		row := memberRow{ID: m.Id, Name: m.Name, Leader: m.Id == resp.LeaderId, Voter: m.Voter, Up: m.Up,
			GRPCAddr: m.GrpcAddr, DataAddr: m.DataAddr, RaftAddr: m.RaftAddr, Transport: m.Transport}
		if m.SinceUnixMs != 0 {
			t := time.UnixMilli(m.SinceUnixMs).UTC()
			row.Since = &t
		}
		if m.TiersUnixMs != 0 {
			t := time.UnixMilli(m.TiersUnixMs).UTC()
			row.TiersAt = &t
		}
		for _, t := range m.Tiers {
			row.Tiers = append(row.Tiers, memberTier{Tier: t.Tier, CapacityBytes: t.CapacityBytes, UsedBytes: t.UsedBytes, Blocks: t.Blocks})
		}
		out.Members = append(out.Members, row)
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "Leader: %s. Directory: %s blocks, applied up to entry %d.\n\n", nodeName(out.Leader), thousands(out.DirectoryKeys), out.AppliedIndex)
	var rows [][]string
	for _, m := range out.Members {
		state := "up"
		if !m.Up {
			state = "DOWN"
		}
		if m.Since != nil {
			state += " since " + m.Since.Local().Format(time.TimeOnly)
		}
		role := "voter"
		if !m.Voter {
			role = "-"
		}
		if m.Leader {
			role = "leader"
		}
		var tiers []string
		for _, t := range m.Tiers {
			tiers = append(tiers, fmt.Sprintf("%s %s/%s", t.Tier, formatBytes(t.UsedBytes), formatBytes(t.CapacityBytes)))
		}
		rows = append(rows, []string{strconv.FormatUint(uint64(m.ID), 10), m.Name, role, state, m.GRPCAddr, m.DataAddr, m.RaftAddr, strings.Join(tiers, ", ")})
	}
	return writeTable(a.stdout, []string{"ID", "NAME", "ROLE", "STATE", "GRPC", "DATA", "RAFT", "TIERS"}, rows)
}

func nodeName(id uint32) string {
	if id == 0 {
		return "none known"
	}
	return "node " + strconv.FormatUint(uint64(id), 10)
}

func (a *app) runLeader(ctx context.Context) error {
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	resp, err := c.Members(ctx)
	if err != nil {
		return fmt.Errorf("cluster leader: %w", err)
	}
	var addr string
	for _, m := range resp.Members {
		if m.Id == resp.LeaderId {
			addr = m.GrpcAddr
		}
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, map[string]any{"leader_id": resp.LeaderId, "grpc_addr": addr})
	}
	if resp.LeaderId == 0 {
		return fmt.Errorf("cluster leader: no leader known (is a majority of the voters up?)")
	}
	_, err = fmt.Fprintf(a.stdout, "%s at %s\n", nodeName(resp.LeaderId), addr)
	return err
}

func (a *app) runJoin(ctx context.Context, f joinFlags) error {
	var probs []string
	if f.id == 0 {
		probs = append(probs, "--id is required and must be > 0")
	}
	if f.raft == "" || f.grpc == "" {
		probs = append(probs, "--raft-addr and --grpc-addr are required")
	}
	if len(probs) > 0 {
		return usageErrorf("cluster join: %s", strings.Join(probs, "; "))
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	if err := c.Join(ctx, &pb.Member{Id: f.id, RaftAddr: f.raft, GrpcAddr: f.grpc, DataAddr: f.data}); err != nil {
		return fmt.Errorf("cluster join: %w", err)
	}
	_, err = fmt.Fprintf(a.stdout, "Node %d joined.\n", f.id)
	return err
}

func (a *app) runRemove(ctx context.Context, arg string, yes bool) error {
	id, err := strconv.ParseUint(arg, 10, 32)
	if err != nil || id == 0 {
		return usageErrorf("cluster remove: %q is not a node id", arg)
	}
	if !yes {
		if !a.stdinTerminal() {
			return usageErrorf("cluster remove: removing node %d drops its blocks from the directory; confirm with --yes", id)
		}
		ok, err := a.ask(fmt.Sprintf("Remove node %d from the cluster? [y/N] ", id))
		if err != nil || !ok {
			return fmt.Errorf("cluster remove: not confirmed")
		}
	}
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	if err := c.Remove(ctx, index.NodeID(id)); err != nil {
		return fmt.Errorf("cluster remove: %w", err)
	}
	_, err = fmt.Fprintf(a.stdout, "Node %d removed.\n", id)
	return err
}

package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
)

func (a *app) newStatsCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show a node's addresses, limits, counters and tiers",
		Long: `stats asks the node at --addr for its statistics and prints:

  - the node: id, version, uptime, its gRPC, data-plane, Redis-protocol and
    HTTP addresses, the data-plane transport, and its request limits;
  - totals: gets, misses, the hit rate (gets that found their block),
    distinct blocks held (keys) and blocks under a lease (pinned);
  - one row per tier, fastest first: TIER POLICY CAPACITY USED USED% BLOCKS
    HITS HIT_RATE (the tier's hits over all gets) EVICTIONS DROPS (evictions
    that kept no copy below) DEMOTIONS (blocks received from above)
    PROMOTIONS (blocks received from below) WATERMARKS (high/low fraction of
    capacity between which the tier frees room);
  - on a node that authenticates its clients, one row per tenant and tier:
    TENANT (its name, when the node knows it) TAG (the tenant tag the tiers
    count by) TIER USED BLOCKS QUOTA (none: not capped) QUOTA% (of its
    quota used), and per tier the evictions its quotas caused.

Sizes are in binary units in the table and in bytes in JSON (-o json).`,
		Example: `  # The local node
  kvctl stats

  # Another node, as JSON, the DRAM tier's use
  kvctl stats --addr cache-3:7070 -o json | jq '.tiers[] | select(.tier == "dram") | .used_bytes'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("stats takes no arguments, got %q", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all {
				return a.runClusterStats(cmd.Context())
			}
			return a.runStats(cmd.Context())
		},
	}
	cmd.Flags().BoolVar(&all, "cluster", false, "every member's tiers, and the replicated directory's totals")
	return cmd
}

// clusterStatsOutput is stats --cluster's JSON document.
type clusterStatsOutput struct {
	Leader        uint32        `json:"leader_id"`
	DirectoryKeys uint64        `json:"directory_keys"`
	Nodes         []statsOutput `json:"nodes"`
	Unreachable   []uint32      `json:"unreachable,omitempty"`
}

// runClusterStats asks every member for its stats.
func (a *app) runClusterStats(ctx context.Context) error {
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	ms, err := c.Members(ctx)
	if err != nil {
		return fmt.Errorf("stats --cluster: %w", err)
	}
	out := clusterStatsOutput{Leader: ms.LeaderId, DirectoryKeys: ms.DirectoryKeys}
	var rows [][]string
	totals := map[string][2]uint64{}
	for _, m := range ms.Members {
		nc, err := a.connectTo(ctx, m.GrpcAddr, client.Options{NoDataPlane: true})
		var st *pb.StatsResponse
		if err == nil {
			st, err = nc.Stats(ctx)
		}
		if err != nil {
			out.Unreachable = append(out.Unreachable, m.Id)
			rows = append(rows, []string{strconv.FormatUint(uint64(m.Id), 10), "-", "-", "-", "-", "-", "unreachable"})
			continue
		}
		so := newStatsOutput(st, time.Now())
		out.Nodes = append(out.Nodes, so)
		for _, t := range so.Tiers {
			state := "up"
			if !m.Up {
				state = "DOWN"
			} else if !t.Available {
				state = "tier down"
			}
			rows = append(rows, []string{strconv.FormatUint(uint64(m.Id), 10), t.Tier, formatBytes(t.CapacityBytes),
				formatBytes(t.UsedBytes), thousands(t.Blocks), thousands(t.Hits), state})
			tt := totals[t.Tier]
			totals[t.Tier] = [2]uint64{tt[0] + t.UsedBytes, tt[1] + t.Blocks}
		}
	}
	if a.output == outputJSON {
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "Leader: %s. Directory: %s blocks across %s.\n\n", nodeName(out.Leader),
		thousands(out.DirectoryKeys), count(len(ms.Members), "node"))
	if err := writeTable(a.stdout, []string{"NODE", "TIER", "CAPACITY", "USED", "BLOCKS", "HITS", "STATE"}, rows); err != nil {
		return err
	}
	for _, tier := range slices.Sorted(maps.Keys(totals)) {
		fmt.Fprintf(a.stdout, "total %s: %s in %s blocks\n", tier, formatBytes(totals[tier][0]), thousands(totals[tier][1]))
	}
	if len(out.Unreachable) > 0 {
		return fmt.Errorf("stats --cluster: %s did not answer", count(len(out.Unreachable), "node"))
	}
	return nil
}

// statsOutput is stats' JSON document, part of kvctl's interface.
type statsOutput struct {
	Node    nodeOutput    `json:"node"`
	Gets    uint64        `json:"gets"`
	Misses  uint64        `json:"misses"`
	HitRate *float64      `json:"hit_rate"` // null before the first get
	Keys    uint64        `json:"keys"`
	Pinned  uint32        `json:"pinned"`
	Tiers   []tierOutput  `json:"tiers"`
	GPUs    []gpuOutput   `json:"gpus,omitempty"`
	uptime  time.Duration // for the table
}

// gpuOutput is one of the node's GPUs; -1 marks a reading it does not give.
type gpuOutput struct {
	Index       uint32  `json:"index"`
	Name        string  `json:"name"`
	UUID        string  `json:"uuid"`
	Utilization float64 `json:"utilization"`
	MemoryUsed  int64   `json:"memory_used_bytes"`
	MemoryTotal int64   `json:"memory_total_bytes"`
	PowerWatts  float64 `json:"power_watts"`
	Temperature float64 `json:"temperature_celsius"`
	PCIeTx      int64   `json:"pcie_tx_bytes_per_second"`
	PCIeRx      int64   `json:"pcie_rx_bytes_per_second"`
	NVLinkTx    int64   `json:"nvlink_tx_bytes"`
	NVLinkRx    int64   `json:"nvlink_rx_bytes"`
}

type nodeOutput struct {
	ID        uint32 `json:"id"`
	Version   string `json:"version"`
	GRPCAddr  string `json:"grpc_addr"`
	DataAddr  string `json:"data_addr"`
	Transport string `json:"transport"`
	// TransportDetail says what the transport uses underneath (ucx: lanes).
	TransportDetail string       `json:"transport_detail,omitempty"`
	RESPAddr        string       `json:"resp_addr"`
	HTTPAddr        string       `json:"http_addr"`
	Tiers           []string     `json:"tiers"`
	Started         time.Time    `json:"started"`
	Uptime          float64      `json:"uptime_seconds"`
	Limits          limitsOutput `json:"limits"`
}

type limitsOutput struct {
	MaxBlockSize   uint64 `json:"max_block_size"`
	MaxBatchBlocks uint32 `json:"max_batch_blocks"`
	MaxBatchBytes  uint64 `json:"max_batch_bytes"`
}

type tierOutput struct {
	Tier          string   `json:"tier"`
	Policy        string   `json:"policy"`
	CapacityBytes uint64   `json:"capacity_bytes"`
	UsedBytes     uint64   `json:"used_bytes"`
	UsedFraction  float64  `json:"used_fraction"`
	Blocks        uint64   `json:"blocks"`
	Hits          uint64   `json:"hits"`
	HitRate       *float64 `json:"hit_rate"` // hits / gets; null before the first get
	Evictions     uint64   `json:"evictions"`
	Drops         uint64   `json:"drops"`
	Demotions     uint64   `json:"demotions"`
	Promotions    uint64   `json:"promotions"`
	HighWatermark float64  `json:"high_watermark"`
	LowWatermark  float64  `json:"low_watermark"`
	Available     bool     `json:"available"`
	Unavailable   string   `json:"unavailable,omitempty"` // why, when it is not
	// Detail holds the tier's own counters (the object store's objects,
	// segments, request errors …).
	Detail map[string]int64 `json:"detail,omitempty"`
	// QuotaEvictions counts evictions that made room within a tenant's
	// quota, of that tenant's own blocks.
	QuotaEvictions uint64 `json:"quota_evictions"`
	// Tenants is each tenant's use of the tier, on a node that
	// authenticates its clients.
	Tenants []tenantOutput `json:"tenants,omitempty"`
}

type tenantOutput struct {
	Tag        uint32  `json:"tenant_tag"`
	Tenant     string  `json:"tenant,omitempty"` // its name, when the node knows it
	Bytes      uint64  `json:"bytes"`
	Blocks     uint64  `json:"blocks"`
	QuotaBytes *uint64 `json:"quota_bytes"` // null: no quota on this tier
}

func (a *app) runStats(ctx context.Context) error {
	c, err := a.connect(ctx, client.Options{})
	if err != nil {
		return err
	}
	st, err := c.Stats(ctx)
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	out := newStatsOutput(st, time.Now())
	if a.output == outputJSON {
		return writeJSON(a.stdout, out)
	}
	return a.writeStats(out)
}

func newStatsOutput(st *pb.StatsResponse, now time.Time) statsOutput {
	n := st.GetNode()
	started := time.UnixMilli(n.GetStartedUnixMs())
	out := statsOutput{
		Node: nodeOutput{ID: n.GetNodeId(), Version: n.GetVersion(), GRPCAddr: n.GetGrpcAddr(), DataAddr: n.GetDataAddr(),
			Transport: n.GetTransport(), TransportDetail: n.GetTransportDetail(), RESPAddr: n.GetRespAddr(), HTTPAddr: n.GetHttpAddr(), Tiers: n.GetTiers(),
			Started: started.UTC(),
			Limits:  limitsOutput{MaxBlockSize: n.GetMaxBlockSize(), MaxBatchBlocks: n.GetMaxBatchBlocks(), MaxBatchBytes: n.GetMaxBatchBytes()}},
		Gets: st.Gets, Misses: st.Misses, Keys: st.Keys, Pinned: st.Pins,
		uptime: now.Sub(started).Round(time.Second),
	}
	out.Node.Uptime = out.uptime.Seconds()
	if st.Gets > 0 {
		r := float64(st.Gets-st.Misses) / float64(st.Gets)
		out.HitRate = &r
	}
	for _, t := range st.Tiers {
		to := tierOutput{Tier: t.Tier, Policy: t.Policy, CapacityBytes: t.CapacityBytes, UsedBytes: t.UsedBytes,
			Blocks: t.Blocks, Hits: t.Hits, Evictions: t.Evictions, Drops: t.Drops, Demotions: t.Demotions,
			Promotions: t.Promotions, HighWatermark: t.HighWatermark, LowWatermark: t.LowWatermark,
			Available: t.Available, Unavailable: t.Unavailable, Detail: t.Detail, QuotaEvictions: t.QuotaEvictions}
		for _, u := range t.Tenants {
			to.Tenants = append(to.Tenants, tenantOutput{Tag: u.TenantTag, Tenant: u.Tenant, Bytes: u.Bytes, Blocks: u.Blocks,
				QuotaBytes: u.QuotaBytes})
		}
		if t.CapacityBytes > 0 {
			to.UsedFraction = float64(t.UsedBytes) / float64(t.CapacityBytes)
		}
		if st.Gets > 0 {
			r := float64(t.Hits) / float64(st.Gets)
			to.HitRate = &r
		}
		out.Tiers = append(out.Tiers, to)
	}
	for _, g := range st.GetGpus() {
		out.GPUs = append(out.GPUs, gpuOutput{Index: g.Index, Name: g.Name, UUID: g.Uuid, Utilization: g.Utilization,
			MemoryUsed: g.MemoryUsedBytes, MemoryTotal: g.MemoryTotalBytes, PowerWatts: g.PowerWatts,
			Temperature: g.TemperatureCelsius, PCIeTx: g.PcieTxBytesPerSecond, PCIeRx: g.PcieRxBytesPerSecond,
			NVLinkTx: g.NvlinkTxBytes, NVLinkRx: g.NvlinkRxBytes})
	}
	return out
}

func (a *app) writeStats(s statsOutput) error {
	or := func(v, none string) string {
		if v == "" {
			return none
		}
		return v
	}
	data := or(s.Node.DataAddr, "off")
	if s.Node.DataAddr != "" {
		data += " (" + s.Node.Transport
		if s.Node.TransportDetail != "" {
			data += ": " + s.Node.TransportDetail
		}
		data += ")"
	}
	rate := func(r *float64) string {
		if r == nil {
			return "-"
		}
		return percent(*r)
	}
	info := [][]string{
		{"NODE", strconv.FormatUint(uint64(s.Node.ID), 10)},
		{"VERSION", s.Node.Version},
		{"UPTIME", s.uptime.String() + " (since " + s.Node.Started.Local().Format(time.DateTime) + ")"},
		{"GRPC", s.Node.GRPCAddr},
		{"DATA", data},
		{"RESP", or(s.Node.RESPAddr, "off")},
		{"HTTP", or(s.Node.HTTPAddr, "off")},
		{"LIMITS", fmt.Sprintf("blocks up to %s; batches up to %s blocks and %s",
			formatBytes(s.Node.Limits.MaxBlockSize), thousands(s.Node.Limits.MaxBatchBlocks), formatBytes(s.Node.Limits.MaxBatchBytes))},
		{"GETS", thousands(s.Gets)},
		{"MISSES", thousands(s.Misses)},
		{"HIT_RATE", rate(s.HitRate)},
		{"KEYS", thousands(s.Keys)},
		{"PINNED", thousands(s.Pinned)},
	}
	var b strings.Builder
	if err := writeTable(&b, info[0], info[1:]); err != nil {
		return err
	}
	fmt.Fprintln(&b)
	header := []string{"TIER", "POLICY", "CAPACITY", "USED", "USED%", "BLOCKS", "HITS", "HIT_RATE",
		"EVICTIONS", "DROPS", "DEMOTIONS", "PROMOTIONS", "WATERMARKS", "STATE"}
	var rows [][]string
	for _, t := range s.Tiers {
		state := "up"
		if !t.Available {
			state = "DOWN"
		}
		rows = append(rows, []string{t.Tier, t.Policy, formatBytes(t.CapacityBytes), formatBytes(t.UsedBytes),
			percent(t.UsedFraction), thousands(t.Blocks), thousands(t.Hits), rate(t.HitRate),
			thousands(t.Evictions), thousands(t.Drops), thousands(t.Demotions), thousands(t.Promotions),
			strconv.FormatFloat(t.HighWatermark, 'g', -1, 64) + "/" + strconv.FormatFloat(t.LowWatermark, 'g', -1, 64), state})
	}
	if err := writeTable(&b, header, rows); err != nil {
		return err
	}
	if err := writeTenants(&b, s.Tiers); err != nil {
		return err
	}
	for _, t := range s.Tiers {
		if t.Unavailable != "" {
			fmt.Fprintf(&b, "\n%s is unavailable: %s\n", t.Tier, t.Unavailable)
		}
		if len(t.Detail) == 0 {
			continue
		}
		names := slices.Sorted(maps.Keys(t.Detail))
		fmt.Fprintf(&b, "\n%s:", t.Tier)
		for _, n := range names {
			fmt.Fprintf(&b, " %s=%s", n, detailValue(n, t.Detail[n]))
		}
		fmt.Fprintln(&b)
	}
	if len(s.GPUs) > 0 {
		fmt.Fprintln(&b)
		if err := writeTable(&b, []string{"GPU", "NAME", "UTIL", "MEMORY", "POWER", "TEMP", "PCIE_TX/RX"}, gpuRows(s.GPUs)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprint(a.stdout, b.String())
	return err
}

// detailValue formats a tier detail's value: bytes in binary units, a
// mode by its name, a count with thousands separated.
func detailValue(name string, v int64) string {
	if names, ok := detailNames[name]; ok && v >= 0 && v < int64(len(names)) {
		return names[v]
	}
	if strings.HasSuffix(name, "bytes") {
		return formatBytes(v)
	}
	return thousands(v)
}

// detailNames names the values of the tier details that are modes, not
// counts: the HBM tier's gds_mode, how it reads blocks from SSD files.
var detailNames = map[string][]string{"gds_mode": {"off", "staged", "compat", "gds"}}

// writeTenants writes the tenants' use of each tier, by tenant, when the
// node counts tenants.
func writeTenants(w io.Writer, tiers []tierOutput) error {
	type row struct {
		name string
		tag  uint32
		tier int
		u    tenantOutput
	}
	var all []row
	evicted := map[string]uint64{}
	for i, t := range tiers {
		for _, u := range t.Tenants {
			all = append(all, row{u.Tenant, u.Tag, i, u})
		}
		if t.QuotaEvictions > 0 {
			evicted[t.Tier] = t.QuotaEvictions
		}
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortStableFunc(all, func(a, b row) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.tag, b.tag), cmp.Compare(a.tier, b.tier))
	})
	var rows [][]string
	for _, r := range all {
		quota, used := "none", "-"
		if q := r.u.QuotaBytes; q != nil {
			quota = formatBytes(*q)
			if *q > 0 {
				used = percent(float64(r.u.Bytes) / float64(*q))
			}
		}
		name := r.name
		if name == "" {
			name = "-"
		}
		rows = append(rows, []string{name, strconv.FormatUint(uint64(r.tag), 10), tiers[r.tier].Tier, formatBytes(r.u.Bytes),
			thousands(r.u.Blocks), quota, used})
	}
	fmt.Fprintln(w)
	if err := writeTable(w, []string{"TENANT", "TAG", "TIER", "USED", "BLOCKS", "QUOTA", "QUOTA%"}, rows); err != nil {
		return err
	}
	for _, t := range tiers {
		if n := evicted[t.Tier]; n > 0 {
			fmt.Fprintf(w, "%s: %s evictions to keep tenants within their quotas\n", t.Tier, thousands(n))
		}
	}
	return nil
}

// gpuRows formats the GPUs' readings; "-" where a device gives none.
func gpuRows(gs []gpuOutput) [][]string {
	known := func(v float64, f func(float64) string) string {
		if v < 0 {
			return "-"
		}
		return f(v)
	}
	bytes := func(v int64) string { return known(float64(v), func(float64) string { return formatBytes(v) }) }
	var rows [][]string
	for _, g := range gs {
		rows = append(rows, []string{strconv.FormatUint(uint64(g.Index), 10), g.Name,
			known(g.Utilization, percent),
			bytes(g.MemoryUsed) + "/" + bytes(g.MemoryTotal),
			known(g.PowerWatts, func(w float64) string { return strconv.FormatFloat(w, 'f', 0, 64) + " W" }),
			known(g.Temperature, func(c float64) string { return strconv.FormatFloat(c, 'f', 0, 64) + " °C" }),
			known(float64(g.PCIeTx), func(float64) string { return formatBytes(g.PCIeTx) + "/s / " + formatBytes(g.PCIeRx) + "/s" })})
	}
	return rows
}

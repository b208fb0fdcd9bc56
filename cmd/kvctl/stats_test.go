package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// statsNode starts a node and makes it hold ten 1 MiB blocks, two of them
// demoted to the SSD by the others, and answer four gets: two hits in
// DRAM, one in the SSD and a miss.
func statsNode(t *testing.T) string {
	t.Helper()
	addr, n := startNode(t)
	keys := putBlocks(t, addr, 7, 1<<20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, k := range append(keys[8:], keys[0], index.Key{NS: 7, Hash: 99}) {
		_, _, _, _ = n.Get(k, nil) // keys[0] was demoted: an SSD hit; 99 is a miss
	}
	return addr
}

func TestStatsShowsTheNodeTotalsAndEveryTier(t *testing.T) {
	addr := statsNode(t)
	code, out, stderr := run(t, "--addr", addr, "stats")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	for _, want := range []string{
		"NODE      1\n",
		"GRPC      " + addr + "\n",
		"DATA      127.0.0.1:", " (tcp)\n",
		"RESP      off\n",
		"LIMITS    blocks up to 1.0 MiB; batches up to 8 blocks and 4.0 MiB\n",
		"GETS      4\n",
		"MISSES    1\n",
		"HIT_RATE  75.00%\n",
		"KEYS      10\n",
		"PINNED    0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Ten blocks in an 8 MiB DRAM: four demoted to the SSD; keys[0]'s SSD
	// hit promoted it back, so it is held twice. Sizes in binary units.
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "TIER" || f[0] == "dram" || f[0] == "ssd") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"TIER POLICY CAPACITY USED USED% BLOCKS HITS HIT_RATE EVICTIONS DROPS DEMOTIONS PROMOTIONS WATERMARKS STATE",
		"dram lru 8.0 MiB 7.0 MiB 87.50% 7 2 50.00% 4 0 0 1 0.95/0.85 up",
		"ssd lru 8.0 MiB 4.0 MiB 50.00% 4 1 25.00% 0 0 4 0 0.95/0.85 up",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("tier table:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(out, "UPTIME    ") {
		t.Errorf("no uptime:\n%s", out)
	}
}

func TestStatsJSONHasRawNumbers(t *testing.T) {
	addr := statsNode(t)
	code, out, stderr := run(t, "--addr", addr, "stats", "-o", "json")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var got struct {
		Node struct {
			ID       uint32 `json:"id"`
			GRPCAddr string `json:"grpc_addr"`
			Limits   struct {
				MaxBlockSize uint64 `json:"max_block_size"`
			} `json:"limits"`
			Uptime *float64 `json:"uptime_seconds"`
		} `json:"node"`
		Gets    uint64   `json:"gets"`
		HitRate *float64 `json:"hit_rate"`
		Keys    uint64   `json:"keys"`
		Tiers   []struct {
			Tier          string   `json:"tier"`
			CapacityBytes uint64   `json:"capacity_bytes"`
			UsedBytes     uint64   `json:"used_bytes"`
			UsedFraction  float64  `json:"used_fraction"`
			Hits          uint64   `json:"hits"`
			HitRate       *float64 `json:"hit_rate"`
			Demotions     uint64   `json:"demotions"`
			HighWatermark float64  `json:"high_watermark"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if got.Node.ID != 1 || got.Node.GRPCAddr != addr || got.Node.Limits.MaxBlockSize != 1<<20 || got.Node.Uptime == nil {
		t.Errorf("node: %+v", got.Node)
	}
	if got.Gets != 4 || got.HitRate == nil || *got.HitRate != 0.75 || got.Keys != 10 || len(got.Tiers) != 2 {
		t.Fatalf("totals: %+v", got)
	}
	d, s := got.Tiers[0], got.Tiers[1]
	if d.Tier != "dram" || d.CapacityBytes != 8<<20 || d.UsedBytes%(1<<20) != 0 || d.UsedFraction != float64(d.UsedBytes)/float64(8<<20) {
		t.Errorf("dram: %+v", d)
	}
	if d.Hits != 2 || *d.HitRate != 0.5 || s.Tier != "ssd" || s.Hits != 1 || s.Demotions != 4 || s.HighWatermark != 0.95 {
		t.Errorf("dram hits %d (rate %v), ssd %+v: want 2 DRAM hits and 1 SSD hit of 4 gets, 4 demotions", d.Hits, *d.HitRate, s)
	}
}

// On a node that counts tenants, stats lists each tenant's use of each
// tier against its quota, by name where the node knows it, and as JSON.
func TestStatsShowsEachTenantsUseAndQuota(t *testing.T) {
	acme, other := index.TagOf("acme"), index.TagOf("other")
	srv := nodetest.Start(t, nodetest.Options{DRAMBytes: 8 << 20, SSDBytes: 8 << 20, Inline: true,
		Limits:     node.Config{MaxBlockSize: 1 << 20, MaxBatchBlocks: 8, MaxBatchBytes: 4 << 20},
		Quotas:     tiers.Quotas{acme: {index.TierDRAM: 2 << 20}},
		TenantName: func(t index.TenantTag) string { return map[index.TenantTag]string{acme: "acme"}[t] }})
	putBlocks(t, srv.Addr, index.BindTenant("acme", 1), 1<<20, 1, 2, 3)
	putBlocks(t, srv.Addr, index.BindTenant("other", 1), 1<<20, 1)
	code, out, stderr := run(t, "--addr", srv.Addr, "stats")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && (f[0] == "TENANT" || f[0] == "acme" || f[0] == "-") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"TENANT TAG TIER USED BLOCKS QUOTA QUOTA%",
		fmt.Sprintf("- %d dram 1.0 MiB 1 none -", other),
		fmt.Sprintf("acme %d dram 2.0 MiB 2 2.0 MiB 100.00%%", acme),
		fmt.Sprintf("acme %d ssd 1.0 MiB 1 none -", acme),
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("tenant table:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(out, "dram: 1 evictions to keep tenants within their quotas\n") {
		t.Errorf("no quota evictions line:\n%s", out)
	}
	code, out, stderr = run(t, "--addr", srv.Addr, "stats", "-o", "json")
	if code != exitOK {
		t.Fatalf("status %d: %s", code, stderr)
	}
	var got struct {
		Tiers []struct {
			Tier           string `json:"tier"`
			QuotaEvictions uint64 `json:"quota_evictions"`
			Tenants        []struct {
				Tag    uint32  `json:"tenant_tag"`
				Tenant string  `json:"tenant"`
				Bytes  uint64  `json:"bytes"`
				Blocks uint64  `json:"blocks"`
				Quota  *uint64 `json:"quota_bytes"`
			} `json:"tenants"`
		} `json:"tiers"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	d := got.Tiers[0]
	if d.Tier != "dram" || d.QuotaEvictions != 1 || len(d.Tenants) != 2 {
		t.Fatalf("dram in JSON: %+v", d)
	}
	for _, u := range d.Tenants {
		if u.Tag == uint32(acme) && (u.Tenant != "acme" || u.Bytes != 2<<20 || u.Quota == nil || *u.Quota != 2<<20) {
			t.Errorf("acme on dram in JSON: %+v", u)
		}
		if u.Tag == uint32(other) && (u.Tenant != "" || u.Quota != nil) {
			t.Errorf("other on dram in JSON: %+v", u)
		}
	}
}

// A node's GPUs are listed under its tiers, "-" for readings a device
// does not give (a GPU without NVLink, a power sensor it lacks).
func TestStatsListsTheNodesGPUs(t *testing.T) {
	st := &pb.StatsResponse{Node: &pb.NodeInfo{}, Gpus: []*pb.GPUDevice{
		{Index: 0, Name: "NVIDIA H200", Utilization: 0.5, MemoryUsedBytes: 70 << 30, MemoryTotalBytes: 141 << 30,
			PowerWatts: 450, TemperatureCelsius: 61, PcieTxBytesPerSecond: 1 << 30, PcieRxBytesPerSecond: 2 << 30},
		{Index: 1, Name: "NVIDIA L4", Utilization: -1, MemoryUsedBytes: 0, MemoryTotalBytes: 24 << 30,
			PowerWatts: -1, TemperatureCelsius: -1, PcieTxBytesPerSecond: -1, PcieRxBytesPerSecond: -1},
	}}
	var out strings.Builder
	a := &app{stdout: &out}
	if err := a.writeStats(newStatsOutput(st, time.Now())); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"GPU  NAME         UTIL    MEMORY              POWER  TEMP   PCIE_TX/RX",
		"0    NVIDIA H200  50.00%  70.0 GiB/141.0 GiB  450 W  61 °C  1.0 GiB/s / 2.0 GiB/s",
		"1    NVIDIA L4    -       0 B/24.0 GiB        -      -      -\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestStatsNamesTheHBMTiersWayOfReadingFiles(t *testing.T) {
	for _, c := range []struct {
		name string
		v    int64
		want string
	}{
		{"gds_mode", 0, "off"}, {"gds_mode", 1, "staged"}, {"gds_mode", 2, "compat"}, {"gds_mode", 3, "gds"},
		{"gds_mode", 9, "9"}, {"gds_bytes", 3 << 20, "3.0 MiB"}, {"file_fills", 12345, "12,345"},
	} {
		if got := detailValue(c.name, c.v); got != c.want {
			t.Errorf("%s=%d shows as %q, want %q", c.name, c.v, got, c.want)
		}
	}
}

//go:build cuda

package daemon_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/config"
	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/hbm"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// A node with hbm.capacity set puts blocks in GPU memory first, demotes
// them into DRAM, and reports the HBM level in its stats.
func TestANodeWithAnHBMTierServesFromTheGPU(t *testing.T) {
	c := hbmNode(t, "4MiB")
	var blocks []client.Block
	for i := range 16 { // 16 MiB through a 4 MiB HBM tier
		data := bytes.Repeat([]byte{byte(i)}, 1<<20)
		blocks = append(blocks, client.Block{Key: index.Key{NS: 1, Hash: index.Hash(i + 1)}, Data: data})
	}
	if err := c.Put(context.Background(), blocks); err != nil {
		t.Fatal(err)
	}
	keys := make([]index.Key, len(blocks))
	for i, b := range blocks {
		keys[i] = b.Key
	}
	res, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !r.Found || !bytes.Equal(r.Data, blocks[i].Data) {
			t.Fatalf("block %d: found %v, %d bytes", i, r.Found, len(r.Data))
		}
	}
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tiers) < 2 || st.Tiers[0].GetTier() != "hbm" || st.Tiers[0].GetBlocks() == 0 || st.Tiers[0].GetEvictions() == 0 {
		t.Fatalf("tiers %v; want hbm first, holding blocks and demoting", st.Tiers)
	}
	if st.Tiers[0].GetDetail()["pinned_host_bytes"] == 0 {
		t.Fatalf("hbm detail %v: DRAM's arena is not pinned", st.Tiers[0].GetDetail())
	}
	if st.Tiers[0].GetDetail()["dma_bytes"] == 0 {
		t.Fatalf("hbm detail %v: no block left the GPU by DMA into DRAM", st.Tiers[0].GetDetail())
	}
}

// hbmNode starts a node with an HBM tier of hbmCapacity on the machine's
// CUDA driver or the stand-in, and a client of it, both stopped at the
// test's end; it skips the test where neither driver loads.
func hbmNode(t *testing.T, hbmCapacity string) *client.Client {
	t.Helper()
	how, err := cudatest.Setup(t.TempDir())
	if err != nil {
		t.Skip(err)
	}
	t.Log("CUDA:", how)
	config.HBMBuilt = true
	t.Cleanup(func() { config.HBMBuilt = false })
	cfg := newConfig(t, t.TempDir(), map[string]string{"hbm-capacity": hbmCapacity, "hbm-page-size": "64KiB",
		"limits-max-block-size": "1MiB"})
	open := func(c config.HBM, maxBlock int64) (tiers.Tier, error) {
		return hbm.Open(hbm.Config{Device: c.Device, Capacity: int64(c.Capacity), PageSize: int(c.PageSize), MaxBlockSize: maxBlock})
	}
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Transport: tcp.New(tcp.Options{}), HBM: open})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	c, err := client.Dial(context.Background(), n.Addrs().GRPC, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

package daemon_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/daemon"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer/tcp"
)

// Overwriting one block many times, with values of one size and then of
// another, keeps a tenant's usage at the one block, within a quota of two,
// and the directory listing it at the node with the last value's size;
// none of the overwrites is refused, and the last value is the one read.
func TestOverwritesKeepUsageAndTheDirectoryExact(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := usersFileWithTenants(t, dir, "\n[tenant.acme]\nquota = { dram = \"8KiB\" }\n")
	cfg := newConfig(t, dir, map[string]string{"auth-users-file": users})
	n, err := daemon.New(cfg, daemon.Options{Logger: quiet(), Version: "test", Transport: tcp.New(tcp.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop(context.Background()) })
	ctx := context.Background()
	c, err := client.Dial(ctx, n.Addrs().GRPC, client.Options{Token: nodetest.TokenAlice})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := index.Key{NS: 1, Hash: 42}
	check := func(size int, last []byte) {
		t.Helper()
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, tier := range st.Tiers {
			for _, u := range tier.Tenants {
				if u.GetBytes() != 0 || u.GetBlocks() != 0 {
					got = append(got, tier.Tier)
				}
				if tier.Tier == "dram" && (u.GetBytes() != uint64(size) || u.GetBlocks() != 1) {
					t.Errorf("dram usage %v after the overwrites; want %d bytes in 1 block", u, size)
				}
			}
		}
		if len(got) != 1 || got[0] != "dram" {
			t.Errorf("tiers with usage: %v; want dram alone", got)
		}
		if err := c.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		locs, err := c.Locate(ctx, []index.Key{k})
		if err != nil {
			t.Fatal(err)
		}
		if l := locs[0].GetLocations(); len(l) != 1 || l[0].GetTier() != "dram" {
			t.Errorf("the directory lists the block at %v; want the node's dram alone", l)
		}
		rs, err := c.Get(ctx, []index.Key{k})
		if err != nil {
			t.Fatal(err)
		}
		if !rs[0].Found || !bytes.Equal(rs[0].Data, last) {
			t.Errorf("read %d bytes (found %v); want the last value's %d", len(rs[0].Data), rs[0].Found, len(last))
		}
	}
	var last []byte
	for _, size := range []int{4096, 2048, 4096} {
		for i := range 300 {
			last = bytes.Repeat([]byte{byte(i), byte(size >> 8)}, size/2)
			if err := c.Put(ctx, []client.Block{{Key: k, Data: last}}); err != nil {
				t.Fatalf("overwrite %d with %d bytes: %v", i, size, err)
			}
		}
		check(size, last)
	}
}

package tiers_test

import (
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// benchTenants are the namespaces of the tenants BenchmarkChurn's blocks
// belong to.
var benchTenants = func() []index.NamespaceID {
	var ns []index.NamespaceID
	for _, t := range []string{"a", "b", "c", "d"} {
		ns = append(ns, index.BindTenant(t, 1))
	}
	return ns
}()

// churn runs b.N rounds of a put of a new version of one of 8192 blocks of
// four tenants and a get of another, over a 1024-block DRAM level and a
// 4096-block second level, inline: every round evicts, demotes and drops.
func churn(b *testing.B, tenants bool, q tiers.Quotas) {
	const keys = 8192
	mk := func(blocks int) tiers.Tier {
		tr, err := dram.New(dram.Config{Capacity: int64(blocks * blockSize), MaxBlockSize: blockSize})
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	h, err := tiers.New(tiers.Config{Inline: true, NoPromote: true, Tenants: tenants, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: mk(1024)}, {Kind: index.TierSSD, Tier: mk(4096)}}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if q != nil {
		if err := h.SetQuotas(q); err != nil {
			b.Fatal(err)
		}
	}
	metas := make([]index.Header, keys)
	var value []byte
	for i := range metas {
		metas[i], value = tiertest.Block(index.Hash(i), blockSize)
		metas[i].Key.NS = benchTenants[i%len(benchTenants)]
	}
	for i := range metas {
		metas[i].Sum = index.Checksum(value)
	}
	dst := make([]byte, 0, blockSize)
	b.SetBytes(blockSize)
	b.ResetTimer()
	for i := range b.N {
		if err := h.Put(metas[(i*31)%keys], value); err != nil {
			b.Fatal(err)
		}
		_, _, _, _ = h.Get(metas[(i*17)%keys].Key, dst)
	}
}

// BenchmarkChurn measures the hierarchy's bookkeeping under constant
// eviction: plain (no tenants, as before quotas existed), tenants
// (counted, no quotas), and quotas (each tenant capped at a quarter of
// each level, so most puts evict the tenant's own blocks).
func BenchmarkChurn(b *testing.B) {
	b.Run("plain", func(b *testing.B) { churn(b, false, nil) })
	b.Run("tenants", func(b *testing.B) { churn(b, true, nil) })
	quarter := tiers.Quotas{}
	for _, ns := range benchTenants {
		quarter[ns.Tenant()] = map[index.TierKind]int64{index.TierDRAM: 256 * blockSize, index.TierSSD: 1024 * blockSize}
	}
	b.Run("quotas", func(b *testing.B) { churn(b, true, quarter) })
}

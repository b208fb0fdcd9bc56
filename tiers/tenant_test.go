package tiers_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

var (
	tenantA = index.BindTenant("a", 1)
	tenantB = index.BindTenant("b", 1)
	tagA    = tenantA.Tenant()
	tagB    = tenantB.Tenant()
)

// tenantLevels is twoLevels with per-tenant accounting.
func tenantLevels(t *testing.T, top, bottom int, change func(*tiers.Config)) *tiers.Hierarchy {
	t.Helper()
	return twoLevels(t, top, bottom, func(c *tiers.Config) {
		c.Tenants = true
		if change != nil {
			change(c)
		}
	})
}

func setQuotas(t *testing.T, h *tiers.Hierarchy, q tiers.Quotas) {
	t.Helper()
	if err := h.SetQuotas(q); err != nil {
		t.Fatal(err)
	}
}

// tenantBlock is block i of the tenant of ns, of size bytes.
func tenantBlock(ns index.NamespaceID, i, size int) (index.Header, []byte) {
	m, b := tiertest.Block(index.Hash(i), size)
	m.Key.NS = ns
	return m, b
}

func putTenant(t *testing.T, h *tiers.Hierarchy, ns index.NamespaceID, i, size int) {
	t.Helper()
	m, b := tenantBlock(ns, i, size)
	if err := h.Put(m, b); err != nil {
		t.Fatalf("put %v: %v", m.Key, err)
	}
}

// tierOf is the fastest kind holding block i of ns, or "gone".
func tierOf(t *testing.T, h *tiers.Hierarchy, ns index.NamespaceID, i int) string {
	t.Helper()
	_, kind, err := h.Stat(index.Key{NS: ns, Hash: index.Hash(i)})
	if errors.Is(err, tiers.ErrNotFound) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return kind.String()
}

// usage is tenant t's use of the level of kind in h's stats.
func usage(h *tiers.Hierarchy, kind index.TierKind, t index.TenantTag) tiers.TenantUsage {
	for _, l := range h.Stats().Levels {
		if l.Kind != kind {
			continue
		}
		for _, u := range l.Tenants {
			if u.Tenant == t {
				return u
			}
		}
	}
	return tiers.TenantUsage{Tenant: t, Quota: tiers.NoQuota}
}

func TestTenantAtItsQuotaEvictsOnlyItsOwnBlocks(t *testing.T) {
	for _, name := range policy.Names {
		t.Run(name, func(t *testing.T) {
			h := tenantLevels(t, 16, 32, func(c *tiers.Config) {
				p, _ := policy.New(name)
				c.Levels[0].Policy = p
			})
			setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 4 * blockSize}})
			for i := range 8 {
				putTenant(t, h, tenantB, i, blockSize)
			}
			for i := range 10 {
				putTenant(t, h, tenantA, i, blockSize)
			}
			for i := range 8 {
				if got := tierOf(t, h, tenantB, i); got != "dram" {
					t.Errorf("b's block %d is in %s, want dram: a's quota evicted it", i, got)
				}
			}
			inDRAM := 0
			for i := range 10 {
				switch tierOf(t, h, tenantA, i) {
				case "dram":
					inDRAM++
				case "gone":
					t.Errorf("a's block %d was dropped, not demoted", i)
				}
			}
			if inDRAM != 4 {
				t.Errorf("a holds %d blocks in dram, want its quota's 4", inDRAM)
			}
			want := tiers.TenantUsage{Tenant: tagA, Bytes: 4 * blockSize, Blocks: 4, Quota: 4 * blockSize}
			if got := usage(h, index.TierDRAM, tagA); got != want {
				t.Errorf("a's dram use %+v, want %+v", got, want)
			}
			if got := usage(h, index.TierSSD, tagA); got.Blocks != 6 || got.Bytes != 6*blockSize || got.Quota != tiers.NoQuota {
				t.Errorf("a's ssd use %+v, want its 6 demoted blocks and no quota", got)
			}
			if got := usage(h, index.TierDRAM, tagB); got.Blocks != 8 || got.Bytes != 8*blockSize {
				t.Errorf("b's dram use %+v, want 8 blocks", got)
			}
		})
	}
}

func TestTenantsLatestBlocksStayWithinQuota(t *testing.T) {
	// LRU within the tenant: the last four puts are what DRAM keeps.
	h := tenantLevels(t, 16, 32, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 4 * blockSize}})
	for i := range 10 {
		putTenant(t, h, tenantA, i, blockSize)
	}
	for i := range 10 {
		want := "ssd"
		if i >= 6 {
			want = "dram"
		}
		if got := tierOf(t, h, tenantA, i); got != want {
			t.Errorf("a's block %d in %s, want %s", i, got, want)
		}
	}
}

func TestDemotionIntoSSDRespectsTheTenantsSSDQuota(t *testing.T) {
	h := tenantLevels(t, 16, 32, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 2 * blockSize, index.TierSSD: 3 * blockSize}})
	for i := range 8 { // 4 in dram, 4 demoted to the ssd
		putTenant(t, h, tenantB, i, blockSize)
		if i < 4 {
			if err := h.Demote(index.TierDRAM, index.Key{NS: tenantB, Hash: index.Hash(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 10 {
		putTenant(t, h, tenantA, i, blockSize)
	}
	var got []string
	for i := range 10 {
		got = append(got, tierOf(t, h, tenantA, i))
	}
	want := "[gone gone gone gone gone ssd ssd ssd dram dram]"
	if fmt.Sprint(got) != want {
		t.Errorf("a's blocks in %v, want %s", got, want)
	}
	for i := range 8 {
		if tierOf(t, h, tenantB, i) == "gone" {
			t.Errorf("b's block %d is gone: a's quota evicted it", i)
		}
	}
	if u := usage(h, index.TierSSD, tagA); u.Bytes != 3*blockSize || u.Blocks != 3 {
		t.Errorf("a's ssd use %+v, want 3 blocks", u)
	}
	if u := usage(h, index.TierSSD, tagB); u.Blocks != 4 {
		t.Errorf("b's ssd use %+v, want its 4 demoted blocks", u)
	}
}

func TestBlockOverItsTenantsQuotaIsRefusedAndChangesNothing(t *testing.T) {
	h := tenantLevels(t, 16, 32, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 3 * 1024}})
	for i := range 3 {
		putTenant(t, h, tenantA, i, 1024)
	}
	before := h.Stats()
	for _, c := range []struct {
		name string
		i    int
	}{{"a new block", 9}, {"a new version of a held block", 1}} {
		m, b := tenantBlock(tenantA, c.i, 4096)
		err := h.Put(m, b)
		var qe *tiers.QuotaError
		if !errors.Is(err, tiers.ErrQuota) || !errors.As(err, &qe) {
			t.Fatalf("%s over the quota: %v, want ErrQuota", c.name, err)
		}
		if qe.Size != 4096 || qe.Quota != 3*1024 || qe.Kind != index.TierDRAM || qe.Tenant != tagA {
			t.Errorf("%s: error %+v", c.name, qe)
		}
		t.Log(err)
	}
	if _, _, _, err := h.Get(index.Key{NS: tenantA, Hash: 9}, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Errorf("the refused block: %v, want not found", err)
	}
	for i := range 3 {
		_, m, kind, err := h.Get(index.Key{NS: tenantA, Hash: index.Hash(i)}, nil)
		if err != nil || kind != index.TierDRAM || m.Size != 1024 {
			t.Errorf("a's block %d after the refusals: %v in %v, %d bytes", i, err, kind, m.Size)
		}
	}
	after := h.Stats()
	for i := range before.Levels {
		b, a := before.Levels[i], after.Levels[i]
		if fmt.Sprint(b.Tenants) != fmt.Sprint(a.Tenants) || b.Evictions != a.Evictions || b.Blocks != a.Blocks {
			t.Errorf("%v changed: %+v, then %+v", b.Kind, b, a)
		}
	}
}

func TestZeroQuotaKeepsATenantOffALevel(t *testing.T) {
	h := tenantLevels(t, 16, 32, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 2 * blockSize, index.TierSSD: 0}})
	for i := range 4 {
		putTenant(t, h, tenantA, i, blockSize)
	}
	if got := tierOf(t, h, tenantA, 0) + " " + tierOf(t, h, tenantA, 1); got != "gone gone" {
		t.Errorf("a's evicted blocks: %s, want dropped (no ssd for a)", got)
	}
	if u := usage(h, index.TierSSD, tagA); u.Blocks != 0 || u.Quota != 0 {
		t.Errorf("a's ssd use %+v", u)
	}
}

func TestQuotasReplacedAtRunTimeTakeEffect(t *testing.T) {
	h := tenantLevels(t, 16, 32, nil)
	for i := range 8 {
		putTenant(t, h, tenantA, i, blockSize)
	}
	// Lowered under the tenant's use: its oldest blocks are demoted now.
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 2 * blockSize}})
	if u := usage(h, index.TierDRAM, tagA); u.Blocks != 2 || u.Quota != 2*blockSize {
		t.Errorf("after lowering a's quota: %+v, want 2 blocks", u)
	}
	if got := tierOf(t, h, tenantA, 0); got != "ssd" {
		t.Errorf("a's oldest block in %s, want ssd", got)
	}
	// Raised: the next puts keep their blocks.
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 6 * blockSize}})
	for i := 8; i < 12; i++ {
		putTenant(t, h, tenantA, i, blockSize)
	}
	if u := usage(h, index.TierDRAM, tagA); u.Blocks != 6 {
		t.Errorf("after raising a's quota: %+v, want 6 blocks", u)
	}
	// Removed: the tenant is capped by the tier alone.
	setQuotas(t, h, nil)
	for i := 12; i < 16; i++ {
		putTenant(t, h, tenantA, i, blockSize)
	}
	if u := usage(h, index.TierDRAM, tagA); u.Blocks != 10 || u.Quota != tiers.NoQuota {
		t.Errorf("after removing a's quota: %+v, want 10 blocks and no quota", u)
	}
}

func TestSetQuotasRefusesBadQuotas(t *testing.T) {
	h := tenantLevels(t, 4, 4, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: blockSize}})
	if err := h.SetQuotas(tiers.Quotas{tagA: {index.TierDRAM: -1}}); !errors.Is(err, tiers.ErrInvalid) {
		t.Errorf("a negative quota: %v, want ErrInvalid", err)
	}
	if u := usage(h, index.TierDRAM, tagA); u.Quota != blockSize {
		t.Errorf("a refused SetQuotas changed a's quota: %+v", u)
	}
	// A kind the node lacks is ignored: one users file serves every node.
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierS3: 1 << 30}})
	plain := twoLevels(t, 4, 4, nil)
	if err := plain.SetQuotas(tiers.Quotas{tagA: {index.TierDRAM: blockSize}}); !errors.Is(err, tiers.ErrInvalid) {
		t.Errorf("quotas without Config.Tenants: %v, want ErrInvalid", err)
	}
	putTenant(t, plain, tenantA, 1, blockSize)
	for _, l := range plain.Stats().Levels {
		if len(l.Tenants) != 0 {
			t.Errorf("%v counts tenants without Config.Tenants: %+v", l.Kind, l.Tenants)
		}
	}
}

// tierUsage sums, per tenant, the blocks each level's tier holds: what
// the hierarchy's accounting must match.
func tierUsage(t *testing.T, h *tiers.Hierarchy, levels []tiers.Tier) map[string]tiers.TenantUsage {
	t.Helper()
	out := map[string]tiers.TenantUsage{}
	for i, tr := range levels {
		kind := h.Kinds()[i]
		err := tr.Scan(func(m index.Header) bool {
			k := fmt.Sprintf("%v/%d", kind, m.Key.NS.Tenant())
			u := out[k]
			u.Tenant, u.Bytes, u.Blocks = m.Key.NS.Tenant(), u.Bytes+int64(m.Size), u.Blocks+1
			out[k] = u
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func accounted(h *tiers.Hierarchy) map[string]tiers.TenantUsage {
	out := map[string]tiers.TenantUsage{}
	for _, l := range h.Stats().Levels {
		for _, u := range l.Tenants {
			if u.Blocks != 0 || u.Bytes != 0 {
				out[fmt.Sprintf("%v/%d", l.Kind, u.Tenant)] = tiers.TenantUsage{Tenant: u.Tenant, Bytes: u.Bytes, Blocks: u.Blocks}
			}
		}
	}
	return out
}

func TestTenantUsageMatchesWhatTheTiersHold(t *testing.T) {
	// Without evictions, a model of the puts and deletes is exact.
	h := tenantLevels(t, 256, 256, nil)
	model := map[index.Key]int{}
	r := rand.New(rand.NewPCG(1, 2))
	spaces := []index.NamespaceID{tenantA, tenantB, index.BindTenant("c", 9), 7}
	for range 2000 {
		ns := spaces[r.IntN(len(spaces))]
		i := r.IntN(40)
		k := index.Key{NS: ns, Hash: index.Hash(i)}
		if r.IntN(4) == 0 {
			err := h.Delete(k)
			if _, ok := model[k]; ok != (err == nil) {
				t.Fatalf("delete %v: %v, model holds it: %v", k, err, ok)
			}
			delete(model, k)
			continue
		}
		size := 512 * (1 + r.IntN(8))
		putTenant(t, h, ns, i, size)
		model[k] = size
	}
	want := map[string]tiers.TenantUsage{}
	for k, size := range model {
		id := fmt.Sprintf("%v/%d", index.TierDRAM, k.NS.Tenant())
		u := want[id]
		u.Tenant, u.Bytes, u.Blocks = k.NS.Tenant(), u.Bytes+int64(size), u.Blocks+1
		want[id] = u
	}
	if got := accounted(h); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("accounted %v\nmodel     %v", got, want)
	}
}

func TestTenantUsageMatchesUnderConcurrentPutsAndEvictions(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprint("inline=", inline), func(t *testing.T) {
			var levels []tiers.Tier
			h := tenantLevels(t, 24, 32, func(c *tiers.Config) {
				c.Inline = inline
				c.Levels[0].HighWatermark, c.Levels[0].LowWatermark = 0.9, 0.7
				for _, l := range c.Levels {
					levels = append(levels, l.Tier)
				}
			})
			quota := tiers.Quotas{
				tagA: {index.TierDRAM: 6 * blockSize, index.TierSSD: 8 * blockSize},
				tagB: {index.TierDRAM: 10 * blockSize},
			}
			setQuotas(t, h, quota)
			spaces := []index.NamespaceID{tenantA, tenantB, index.BindTenant("c", 9), 7}
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 3))
					for range 600 {
						ns := spaces[r.IntN(len(spaces))]
						i := r.IntN(30)
						k := index.Key{NS: ns, Hash: index.Hash(i)}
						switch r.IntN(10) {
						case 0:
							_ = h.Delete(k)
						case 1:
							_ = h.Demote(index.TierDRAM, k)
						case 2:
							_ = h.DeleteFrom(index.TierSSD, k)
						case 3, 4:
							_, _, _, _ = h.Get(k, nil)
						case 5:
							if l, err := h.Pin([]index.Key{k}, time.Minute); err == nil {
								_, _, _, _ = h.Get(k, nil)
								l.Release()
							}
						default:
							m, b := tenantBlock(ns, i, 1024*(1+r.IntN(4)))
							if err := h.Put(m, b); err != nil && !errors.Is(err, tiers.ErrQuota) && !errors.Is(err, tiers.ErrFull) {
								t.Errorf("put %v: %v", k, err)
							}
						}
					}
				}()
			}
			wg.Wait()
			h.Settle()
			got, want := accounted(h), tierUsage(t, h, levels)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("accounted %v\ntiers hold %v", got, want)
			}
			for _, l := range h.Stats().Levels {
				for _, u := range l.Tenants {
					if q, ok := quota[u.Tenant][l.Kind]; ok && u.Bytes > q {
						t.Errorf("tenant %d holds %d bytes on %v, over its %d quota", u.Tenant, u.Bytes, l.Kind, q)
					}
				}
			}
		})
	}
}

func TestReservationsCountAgainstTheQuotaUntilCommittedOrAborted(t *testing.T) {
	h := tenantLevels(t, 16, 32, nil)
	setQuotas(t, h, tiers.Quotas{tagA: {index.TierDRAM: 2 * blockSize, index.TierSSD: 0}})
	m1, b1 := tenantBlock(tenantA, 1, blockSize)
	r1, err := h.Reserve(m1)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := tenantBlock(tenantA, 2, blockSize)
	r2, err := h.Reserve(m2)
	if err != nil {
		t.Fatal(err)
	}
	// Both reservations hold the whole quota: a third block of the
	// tenant finds none of its blocks to evict.
	m3, b3 := tenantBlock(tenantA, 3, blockSize)
	if err := h.Put(m3, b3); !errors.Is(err, tiers.ErrQuota) {
		t.Fatalf("a put while reservations hold the quota: %v, want ErrQuota", err)
	}
	copy(r1.Bytes(), b1)
	if err := r1.Commit(); err != nil {
		t.Fatal(err)
	}
	r2.Abort()
	if u := usage(h, index.TierDRAM, tagA); u.Bytes != blockSize || u.Blocks != 1 {
		t.Errorf("after one commit and one abort: %+v, want one block", u)
	}
	if err := h.Put(m3, b3); err != nil {
		t.Fatalf("a put in the room the abort gave back: %v", err)
	}
	if got := tierOf(t, h, tenantA, 1) + " " + tierOf(t, h, tenantA, 3); got != "dram dram" {
		t.Errorf("a's blocks in %s, want both in dram", got)
	}
}

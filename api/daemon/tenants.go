package daemon

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// tenants is what the node knows of the users file's tenants: their quotas
// per tier, which the tiers enforce, and their names, which /metrics and
// the Stats reply show next to the tags the tiers count by.
type tenants struct {
	mu     sync.Mutex
	h      *tiers.Hierarchy // nil until the tiers are open
	quotas tiers.Quotas
	names  map[index.TenantTag]string
}

// name is tag's tenant's name, or "" when no tenant of the users file has
// that tag.
func (t *tenants) name(tag index.TenantTag) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.names[tag]
}

// open gives the tenants' quotas to the tiers, now and on every change.
func (t *tenants) open(h *tiers.Hierarchy) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.h = h
	if t.quotas == nil {
		return nil
	}
	return h.SetQuotas(t.quotas)
}

// SetTenants applies the users file's tenants — each tenant's quota in
// bytes per tier, by tier name (dram, ssd, s3; a tier the node lacks is
// ignored), every tenant listed, with or without quotas — to the node:
// its tiers keep each tenant within its quotas, evicting the tenant's
// own blocks, and /metrics and kvctl stats name the tenants. The users
// file's reader calls it when it loads the file and on every reload
// (SIGHUP); it may do so before Start. It fails, changing nothing, on an
// unknown tier name, a negative quota, or two tenants whose names share
// a tag (index.TagOf), which the tiers could not tell apart.
func (d *Node) SetTenants(quotas map[string]map[string]int64) error {
	q, names, err := tenantQuotas(quotas)
	if err != nil {
		return err
	}
	t := &d.tenants
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h != nil {
		if err := t.h.SetQuotas(q); err != nil {
			return err
		}
	}
	t.quotas, t.names = q, names
	return nil
}

// tenantQuotas turns quotas by tenant and tier name into the tiers'
// quotas by tag and kind, and names the tags.
func tenantQuotas(byName map[string]map[string]int64) (tiers.Quotas, map[index.TenantTag]string, error) {
	q := tiers.Quotas{}
	names := map[index.TenantTag]string{}
	for _, tenant := range slices.Sorted(maps.Keys(byName)) {
		if tenant == "" {
			return nil, nil, fmt.Errorf("tenants: a tenant without a name")
		}
		tag := index.TagOf(tenant)
		if other, ok := names[tag]; ok {
			return nil, nil, fmt.Errorf("tenants: %q and %q share tenant tag %d: rename one", other, tenant, tag)
		}
		names[tag] = tenant
		for _, tier := range slices.Sorted(maps.Keys(byName[tenant])) {
			kind, err := index.ParseTierKind(tier)
			if err != nil {
				return nil, nil, fmt.Errorf("tenants: %s's quota: %w", tenant, err)
			}
			bytes := byName[tenant][tier]
			if bytes < 0 {
				return nil, nil, fmt.Errorf("tenants: %s's %s quota of %d bytes is negative", tenant, tier, bytes)
			}
			if q[tag] == nil {
				q[tag] = map[index.TierKind]int64{}
			}
			q[tag][kind] = bytes
		}
	}
	return q, names, nil
}

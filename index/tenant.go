package index

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// TenantTag marks the namespaces of one tenant: BindTenant puts it in a
// namespace's top 16 bits, so that the tiers can count and evict a
// tenant's blocks by their keys alone, across restarts, without knowing
// who the tenant is. Tag 0 is the space of identities without a tenant.
type TenantTag uint16

// tenantBits is where a bound namespace keeps its tenant's tag.
const tenantBits = 48

// TagOf is tenant's tag: 0 for "", else a hash of the name in 1…65535.
// Two tenants may share a tag; whoever lists tenants (a users file) must
// refuse such a pair.
func TagOf(tenant string) TenantTag {
	if tenant == "" {
		return 0
	}
	return TenantTag(1 + xxhash.Sum64String("kvstrata tenant\x00"+tenant)%0xffff)
}

// Tenant is the tag of a namespace made by BindTenant. For a namespace
// that was never bound (a node without authentication) it means nothing.
func (n NamespaceID) Tenant() TenantTag { return TenantTag(n >> tenantBits) }

// BindTenant is the namespace a client of tenant stores ns as. A node
// that authenticates its clients binds every namespace a client names to
// the client's tenant, so two tenants never share a key however they
// choose their namespaces: the result's top 16 bits are TagOf(tenant),
// and its other 48 a hash of tenant and ns.
func BindTenant(tenant string, ns NamespaceID) NamespaceID {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(ns))
	d := xxhash.New()
	_, _ = d.WriteString(tenant)
	_, _ = d.Write([]byte{0})
	_, _ = d.Write(b[:])
	return NamespaceID(uint64(TagOf(tenant))<<tenantBits | d.Sum64()&(1<<tenantBits-1))
}

package tiers

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"slices"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers/policy"
)

// ErrQuota marks a block refused because its tenant's quota on a level
// leaves no room for it: the block alone is over the quota, or every
// block the tenant holds there is pinned or being moved. Nothing else was
// evicted for it but the tenant's own blocks.
var ErrQuota = errors.New("tiers: tenant quota exceeded")

// QuotaError is the error for a block its tenant's quota refuses; it
// matches ErrQuota.
type QuotaError struct {
	Tenant index.TenantTag
	Kind   index.TierKind
	Size   int64 // the block's bytes
	Quota  int64 // the tenant's quota on the level, in bytes
	Used   int64 // the tenant's bytes on the level, the refused block's older version excluded
}

func (e *QuotaError) Error() string {
	if e.Size > e.Quota {
		return fmt.Sprintf("tiers: tenant %d's %v quota is %s: a %s block does not fit", e.Tenant, e.Kind,
			units.FormatBytes(e.Quota), units.FormatBytes(e.Size))
	}
	return fmt.Sprintf("tiers: tenant %d holds %s of its %s %v quota and none of it can be evicted for a %s block "+
		"(pinned or being moved)", e.Tenant, units.FormatBytes(e.Used), units.FormatBytes(e.Quota), e.Kind, units.FormatBytes(e.Size))
}

func (e *QuotaError) Is(target error) bool { return target == ErrQuota }

// Quotas caps the bytes of each tenant's blocks on each kind of level. A
// tenant or a kind it does not list is not capped; a quota of 0 keeps the
// tenant off that level.
type Quotas map[index.TenantTag]map[index.TierKind]int64

// NoQuota is TenantUsage.Quota of a tenant without a quota on a level.
const NoQuota = -1

// TenantUsage is one tenant's part of one level: the blocks of its
// namespaces (index.BindTenant) the level holds, counted by their sizes
// (allocation overhead excluded), and its quota there.
type TenantUsage struct {
	Tenant index.TenantTag
	Bytes  int64
	Blocks int64
	Quota  int64 // bytes, or NoQuota
}

// share is one tenant's part of one level. A share exists while the
// tenant has blocks on the level, bytes held for a put, or a quota.
type share struct {
	bytes, blocks int64
	// held counts the bytes of puts admitted under the quota whose copies
	// are not recorded yet, so that concurrent puts cannot both take the
	// last room.
	held  int64
	quota int64 // bytes, or NoQuota
	// order ranks the tenant's blocks on the level for its own evictions,
	// by a policy of the level's kind; nil without a quota.
	order policy.Policy
}

// SetQuotas replaces every tenant's quotas, at once; a later call
// replaces them again (a users file reloaded). Quotas on kinds of tier
// the hierarchy does not have are ignored (one users file serves nodes
// with different tiers). It fails with ErrInvalid, changing nothing, on
// a negative quota or a hierarchy whose Config.Tenants is off. A tenant found
// over a new, lower quota gives up its own victims (demoted as usual)
// in the background, or before SetQuotas returns when Config.Inline is
// set.
func (h *Hierarchy) SetQuotas(q Quotas) error {
	if !h.cfg.Tenants {
		return fmt.Errorf("%w: quotas need Config.Tenants (namespaces bound to tenants)", ErrInvalid)
	}
	for _, t := range slices.Sorted(maps.Keys(q)) {
		for kind, bytes := range q[t] {
			if bytes < 0 {
				return fmt.Errorf("%w: tenant %d's %v quota of %d bytes is negative", ErrInvalid, t, kind, bytes)
			}
		}
	}
	h.lock()
	n := 0
	for i, l := range h.levels {
		for t, s := range l.shares {
			if _, ok := q[t][l.Kind]; !ok {
				s.quota, s.order = NoQuota, nil
				h.forgetShareLocked(i, t, s)
			}
		}
		for t, kinds := range q {
			quota, ok := kinds[l.Kind]
			if !ok {
				continue
			}
			s := h.shareLocked(i, t)
			s.quota = quota
			if s.order == nil {
				s.order = h.orderLocked(i, t)
			}
			n++
		}
	}
	h.quotas.Store(int32(n))
	h.mu.Unlock()
	h.overQuota.Store(true)
	if h.cfg.Inline {
		h.trimQuotas()
		return nil
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
	return nil
}

// shareLocked returns tenant t's share of level i, made if need be.
func (h *Hierarchy) shareLocked(i int, t index.TenantTag) *share {
	l := h.levels[i]
	s := l.shares[t]
	if s == nil {
		s = &share{quota: NoQuota}
		l.shares[t] = s
	}
	return s
}

// forgetShareLocked drops tenant t's share of level i once nothing is
// left in it, so that the shares stay as many as the tenants present.
func (h *Hierarchy) forgetShareLocked(i int, t index.TenantTag, s *share) {
	if s.blocks == 0 && s.bytes == 0 && s.held == 0 && s.quota == NoQuota {
		delete(h.levels[i].shares, t)
	}
}

// orderLocked ranks the blocks tenant t holds on level i by a fresh
// policy of the level's kind (LRU for one New cannot build), fed oldest
// access first. It walks every entry: it runs when a quota is set, not
// per access.
func (h *Hierarchy) orderLocked(i int, t index.TenantTag) policy.Policy {
	p, err := policy.New(h.levels[i].Policy.Name())
	if err != nil {
		p = policy.NewLRU()
	}
	var held []*entry
	for k, e := range h.entries {
		if k.NS.Tenant() == t && e.in&(1<<i) != 0 {
			held = append(held, e)
		}
	}
	slices.SortFunc(held, func(a, b *entry) int { return cmp.Compare(a.atime.Load(), b.atime.Load()) })
	for _, e := range held {
		p.Add(policyEntry(e.meta))
	}
	return p
}

// chargeLocked counts a copy of m entering (n = 1) or leaving (n = -1)
// level i in its tenant's share.
func (h *Hierarchy) chargeLocked(i int, m index.Header, n int64) {
	if !h.cfg.Tenants {
		return
	}
	t := m.Key.NS.Tenant()
	s := h.shareLocked(i, t)
	s.bytes += n * int64(m.Size)
	s.blocks += n
	if s.order != nil {
		if n > 0 {
			s.order.Add(policyEntry(m))
		} else {
			s.order.Remove(m.Key)
		}
	}
	if n < 0 {
		h.forgetShareLocked(i, t, s)
	}
}

// resizeLocked counts e's recorded copies at size bytes rather than
// e.meta.Size: a new version replaces the key, and the older copies left
// in other levels are dropped before the key's owner lets go of it.
func (h *Hierarchy) resizeLocked(e *entry, size uint32) {
	if !h.cfg.Tenants || e.in == 0 || e.meta.Size == size {
		return
	}
	t := e.meta.Key.NS.Tenant()
	for in := e.in; in != 0; in &= in - 1 {
		h.shareLocked(bits.TrailingZeros8(in), t).bytes += int64(size) - int64(e.meta.Size)
	}
}

// touchOwnLocked records an access to level i's copy of key in its
// tenant's order, if the tenant has a quota there.
func (h *Hierarchy) touchOwnLocked(i int, key index.Key) {
	if h.quotas.Load() == 0 {
		return
	}
	if s := h.levels[i].shares[key.NS.Tenant()]; s != nil && s.order != nil {
		s.order.Touch(key)
	}
}

// holdQuota makes room for m on level i within its tenant's quota there,
// evicting the tenant's own victims, and holds m.Size bytes of the quota
// until the copy is recorded (setLocked) or the key's owner lets go of it
// (release). The caller owns m.Key. It fails with a *QuotaError, having
// changed nothing, when the block alone is over the quota, or having
// evicted some of the tenant's blocks, when the rest cannot go.
func (h *Hierarchy) holdQuota(i int, m index.Header) error {
	if h.quotas.Load() == 0 {
		return nil // no quota anywhere: nothing to hold
	}
	t, size := m.Key.NS.Tenant(), int64(m.Size)
	for {
		h.lock()
		s, e := h.levels[i].shares[t], h.entries[m.Key]
		if s == nil || s.quota == NoQuota || e == nil || e.holdIn == uint8(i+1) {
			h.mu.Unlock()
			return nil
		}
		used := s.bytes + s.held
		if e.in&(1<<i) != 0 {
			used -= int64(e.meta.Size) // the older version is replaced in place
		}
		qerr := &QuotaError{Tenant: t, Kind: h.levels[i].Kind, Size: size, Quota: s.quota, Used: used}
		if size > s.quota {
			h.mu.Unlock()
			return qerr
		}
		if used+size <= s.quota {
			h.unholdLocked(e, m.Key)
			s.held += size
			e.hold, e.holdIn = m.Size, uint8(i+1)
			h.mu.Unlock()
			return nil
		}
		h.mu.Unlock()
		if !h.evict(i, t, true) {
			return qerr
		}
	}
}

// unholdLocked gives back the quota the owner of key, e's key, holds, if
// any.
func (h *Hierarchy) unholdLocked(e *entry, key index.Key) {
	if e.holdIn == 0 {
		return
	}
	i, t := int(e.holdIn)-1, key.NS.Tenant()
	if s := h.levels[i].shares[t]; s != nil {
		s.held -= int64(e.hold)
		h.forgetShareLocked(i, t, s)
	}
	e.hold, e.holdIn = 0, 0
}

// trimQuotas brings every tenant over its quota on a level (a quota
// lowered, or blocks loaded or found in a shared level) back under it by
// evicting its own victims. It does nothing unless SetQuotas ran since
// the last trim.
func (h *Hierarchy) trimQuotas() {
	if !h.overQuota.CompareAndSwap(true, false) {
		return
	}
	type over struct {
		i int
		t index.TenantTag
	}
	var todo []over
	h.lock()
	for i, l := range h.levels {
		for t, s := range l.shares {
			if s.quota != NoQuota && s.bytes > s.quota {
				todo = append(todo, over{i, t})
			}
		}
	}
	h.mu.Unlock()
	for _, o := range todo {
		for {
			h.lock()
			s := h.levels[o.i].shares[o.t]
			more := s != nil && s.quota != NoQuota && s.bytes > s.quota
			h.mu.Unlock()
			if !more || !h.evict(o.i, o.t, true) {
				break
			}
		}
	}
}

// tenantStatsLocked lists level i's shares, by tenant.
func (h *Hierarchy) tenantStatsLocked(i int) []TenantUsage {
	l := h.levels[i]
	if len(l.shares) == 0 {
		return nil
	}
	out := make([]TenantUsage, 0, len(l.shares))
	for t, s := range l.shares {
		out = append(out, TenantUsage{Tenant: t, Bytes: s.bytes, Blocks: s.blocks, Quota: s.quota})
	}
	slices.SortFunc(out, func(a, b TenantUsage) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return out
}

func policyEntry(m index.Header) policy.Entry {
	return policy.Entry{Key: m.Key, Parent: m.Parent, HasParent: m.HasParent, Size: int64(m.Size)}
}

package node

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Selector chooses blocks to evict. Every set field must match; an empty
// selector matches nothing unless All is set, so that a forgotten flag never
// empties a node.
type Selector struct {
	Namespace *index.NamespaceID
	Tier      index.TierKind // 0: every tier
	Keys      []index.Key
	// OlderThan selects blocks not accessed for at least this long; an age
	// that reaches back before the Unix epoch selects none.
	OlderThan time.Duration
	// Bytes stops the eviction once this many bytes are freed, taking the
	// least recently used matching blocks first. 0: no limit.
	Bytes  int64
	All    bool
	DryRun bool
	// Demote moves the selected copies out of Tier into the next tier
	// down instead of removing them; pinned blocks move too.
	Demote bool
	// Tenant, if set, keeps the eviction to the blocks of namespaces bound
	// to this tenant tag (index.BindTenant), whatever else selects: a
	// tenant's eviction never reaches another's blocks. It selects
	// nothing by itself.
	Tenant *index.TenantTag
}

// Empty reports whether s selects by nothing.
func (s Selector) Empty() bool {
	return s.Namespace == nil && s.Tier == 0 && len(s.Keys) == 0 && s.OlderThan == 0 && s.Bytes == 0
}

// Evicted is one copy an eviction removed (or would remove, dry).
type Evicted struct {
	Meta index.Header
	Tier index.TierKind
}

// EvictResult sums up an eviction.
type EvictResult struct {
	Blocks  int64     // copies removed
	Bytes   int64     // their bytes
	Removed []Evicted // every copy removed, least recently used first
	Pinned  int64     // matching blocks left alone because a lease holds them
}

// Evict removes the copies s selects: from s.Tier only, or from every tier.
// Pinned blocks are skipped and counted. With DryRun nothing is removed.
func (n *Node) Evict(s Selector) (EvictResult, error) {
	if s.Empty() && !s.All {
		return EvictResult{}, &LimitError{"an eviction with no selector would remove everything: select by namespace, tier, keys, age or bytes, or say all"}
	}
	if s.OlderThan < 0 || s.Bytes < 0 {
		return EvictResult{}, fmt.Errorf("%w: negative age or byte count", tiers.ErrInvalid)
	}
	if s.Tier != 0 && !slices.Contains(n.h.Kinds(), s.Tier) {
		return EvictResult{}, fmt.Errorf("%w: this node has no %v tier (it has %v)", tiers.ErrInvalid, s.Tier, n.h.Kinds())
	}
	if kinds := n.h.Kinds(); s.Demote && (s.Tier == 0 || s.Tier == kinds[len(kinds)-1]) {
		return EvictResult{}, fmt.Errorf("%w: demote needs a tier with another below it (this node has %v)", tiers.ErrInvalid, kinds)
	}
	var keys map[index.Key]bool
	if len(s.Keys) > 0 {
		keys = make(map[index.Key]bool, len(s.Keys))
		for _, k := range s.Keys {
			keys[k] = true
		}
	}
	cutoff := time.Now().Add(-s.OlderThan)
	if s.OlderThan > 0 && cutoff.Before(time.Unix(0, 0)) {
		return EvictResult{}, nil // no block was last accessed before 1970
	}
	var res EvictResult
	matches := n.h.Blocks(func(b tiers.BlockInfo) bool {
		switch {
		case s.Namespace != nil && b.Key.NS != *s.Namespace,
			s.Tenant != nil && b.Key.NS.Tenant() != *s.Tenant,
			keys != nil && !keys[b.Key],
			s.Tier != 0 && !slices.Contains(b.Kinds, s.Tier),
			s.OlderThan > 0 && b.LastAccess.After(cutoff):
			return false
		case b.Pinned && !s.Demote:
			res.Pinned++
			return false
		}
		return true
	})
	slices.SortFunc(matches, func(a, b tiers.BlockInfo) int { return a.LastAccess.Compare(b.LastAccess) })
	for _, b := range matches {
		if s.Bytes > 0 && res.Bytes >= s.Bytes {
			break
		}
		kinds := b.Kinds
		if s.Tier != 0 {
			kinds = []index.TierKind{s.Tier}
		}
		if !s.DryRun {
			var err error
			switch {
			case s.Demote:
				err = n.demote(s.Tier, b.Key)
			case s.Tier != 0:
				err = n.h.DeleteFrom(s.Tier, b.Key)
			default:
				err = n.h.Delete(b.Key)
			}
			switch {
			case errors.Is(err, tiers.ErrNotFound):
				continue // evicted or deleted meanwhile
			case errors.Is(err, tiers.ErrPinned):
				res.Pinned++
				continue
			case err != nil:
				return res, fmt.Errorf("evict %v: %w", b.Key, err)
			}
		}
		for _, k := range kinds {
			res.Blocks++
			res.Bytes += int64(b.Size)
			res.Removed = append(res.Removed, Evicted{Meta: b.Header, Tier: k})
		}
	}
	return res, nil
}

// busyWait is how long a demotion waits, in all, for a busy tier below
// (an object store's upload backlog) to take a block.
const busyWait = 2 * time.Minute

// demote moves key out of kind, waiting while the tier below is busy.
func (n *Node) demote(kind index.TierKind, key index.Key) error {
	wait := 10 * time.Millisecond
	for deadline := time.Now().Add(busyWait); ; {
		err := n.h.Demote(kind, key)
		if !errors.Is(err, tiers.ErrBusy) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 500*time.Millisecond)
	}
}

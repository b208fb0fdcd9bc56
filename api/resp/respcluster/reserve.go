package respcluster

import (
	"context"

	"github.com/kvstrata/kvstrata/api/resp"
)

var _ resp.SetReserver = (*Store)(nil)

// ReserveSet is the local store's ReserveSet (resp.SetReserver), when it
// has it, for a plain SET: the value is committed here, then the other
// copies are deleted, as Set does. Without it the server reads the value
// itself and calls Set or SetWith (ok false).
func (s *Store) ReserveSet(ctx context.Context, key string, size int) (resp.PendingSet, bool, error) {
	r, ok := s.local.(resp.SetReserver)
	if !ok {
		return nil, false, nil
	}
	p, ok, err := r.ReserveSet(ctx, key, size)
	if err != nil || !ok {
		return nil, ok, err
	}
	return &pendingSet{PendingSet: p, s: s, ctx: ctx, key: key}, true, nil
}

// pendingSet is a local PendingSet whose commit also deletes the key's
// copies on the other nodes.
type pendingSet struct {
	resp.PendingSet
	s   *Store
	ctx context.Context
	key string
}

func (p *pendingSet) Commit() error {
	if err := p.PendingSet.Commit(); err != nil {
		return err
	}
	return p.s.invalidate(p.ctx, p.key)
}

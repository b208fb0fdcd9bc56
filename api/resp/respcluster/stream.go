package respcluster

import (
	"context"
	"errors"

	"github.com/kvstrata/kvstrata/api/resp"
)

var _ resp.Streamer = (*Store)(nil)

// ViewStream is View with the local store's streaming (resp.Streamer)
// when it has it: a large value held here is written to the client piece
// by piece. A value fetched from another node comes whole, as from View.
func (s *Store) ViewStream(ctx context.Context, key string) (resp.StreamValue, error) {
	st, ok := s.local.(resp.Streamer)
	if !ok {
		v, release, err := s.View(ctx, key)
		return resp.StreamValue{Bytes: v, Release: release}, err
	}
	v, err := st.ViewStream(ctx, key)
	if err == nil || !errors.Is(err, resp.ErrNotFound) && !errors.Is(err, resp.ErrUnavailable) {
		return v, err
	}
	rv, rerr := s.remoteGet(ctx, key)
	switch {
	case rerr == nil:
		return resp.StreamValue{Bytes: rv, Release: func() {}}, nil
	case errors.Is(rerr, resp.ErrNotFound):
		return resp.StreamValue{}, err // the local answer: a miss, or its own TRYAGAIN
	}
	return resp.StreamValue{}, rerr
}

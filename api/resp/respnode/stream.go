package respnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
)

var _ resp.Streamer = (*Store)(nil)

// ViewStream returns an inline value in place, as View does, and a
// chunked one as a stream of its chunks, each read in place when the tier
// allows and checked against its checksum before it is handed out, so
// that a GET holds one chunk at a time, never the whole value. The chunks
// are pinned for the stream (for at most the node's view lease), so
// eviction cannot cut it; they are all checked present before the first
// is handed out, so a value that lost one is a miss, as in View.
func (s *Store) ViewStream(ctx context.Context, key string) (resp.StreamValue, error) {
	k := keyOf(ctx, key)
	for range 3 {
		v, rec, err := s.viewRecord(k, key, false)
		if err != nil {
			return resp.StreamValue{}, err
		}
		if rec.kind == kindInline {
			return resp.StreamValue{Bytes: rec.value, Release: func() { _ = v.Release() }}, nil
		}
		deadline, m := rec.deadline, rec.manifest
		_ = v.Release()
		keys := make([]index.Key, len(m.sums))
		for i := range keys {
			keys[i] = chunkKey(k, m.gen, i)
		}
		lease, err := s.h.Pin(keys, s.n.Config().ViewLease)
		if err != nil {
			return resp.StreamValue{}, respError(err)
		}
		held := true
		for _, ck := range keys {
			if _, _, err := s.h.Stat(ck); err != nil {
				held = false
				break
			}
		}
		if held {
			return resp.StreamValue{Size: m.size, Stream: func(emit func([]byte) error) error {
				defer lease.Release()
				return s.streamChunks(keys, m, emit)
			}}, nil
		}
		lease.Release()
		if !s.dropIf(k, key, func(r *record) bool {
			return r.kind == kindManifest && r.manifest.gen == m.gen && r.deadline == deadline
		}) {
			continue
		}
		return resp.StreamValue{}, fmt.Errorf("key %q: part of its value was evicted: %w", key, resp.ErrNotFound)
	}
	return resp.StreamValue{}, fmt.Errorf("key %q: replaced during three reads in a row: %w", key, resp.ErrNotFound)
}

// streamChunks hands out the chunks of m in order, each checked.
func (s *Store) streamChunks(keys []index.Key, m manifest, emit func([]byte) error) error {
	left := m.size
	for i, ck := range keys {
		v, _, err := s.n.View(ck)
		if err != nil {
			return fmt.Errorf("chunk %d of %d: %w", i, len(keys), errors.Join(errChunkLost, err))
		}
		b := v.Bytes()
		if want := min(m.chunkSize, left); int64(len(b)) != want || index.Checksum(b) != m.sums[i] {
			_ = v.Release()
			return fmt.Errorf("chunk %d of %d: %d bytes, want %d with checksum %016x: %w", i, len(keys), len(b), want, m.sums[i], errChunkLost)
		}
		err = emit(b)
		_ = v.Release()
		if err != nil {
			return err
		}
		left -= int64(len(b))
	}
	return nil
}

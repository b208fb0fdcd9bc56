// Package respnode serves a cache node's blocks to Redis clients: it is
// the resp.KeyStore of an api/node.Node. Values go through the same tiers,
// limits and checksums as every other block. Key k is block
// {index.RESPNamespace, xxhash64(k)} — for a client that authenticated as
// a user of a tenant, in the namespace bound to that tenant
// (auth.NamespaceOf), so that tenants never see each other's keys —
// which holds a record (format.go): k,
// its deadline, and either the value or, for a value over
// limits.max-block-size, a manifest of the chunk blocks holding it, in a
// namespace of their own, so that only records count as keys.
//
// A chunked value is written chunks first, each under a name of this
// write's own, then its record: the record is the commit point, so a
// failure leaves the old value readable and a reader sees the old value
// or the new, whole. A chunk that eviction dropped makes the value a miss
// (and the record and its other chunks are then deleted); chunks no record
// names — left by a crash mid-write — are blocks like any other, evicted
// in their turn.
//
// An expired key reads as missing everywhere and is deleted when a read
// meets it; until then it is evicted as any cold block is. There is no
// sweep: memory of an expired key is reclaimed lazily.
//
// A Store is safe for concurrent use.
package respnode

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/auth"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// stripes is the number of write locks; keys share them by hash.
const stripes = 64

// Store serves a node's blocks to Redis clients (resp.KeyStore). Give a
// node one Store: its locks make SET … NX/XX, MSET and EXEC atomic among
// the writes that go through it.
type Store struct {
	n *node.Node
	h *tiers.Hierarchy

	// locks serialise the writes of one key (by its hash); a write of
	// several keys takes theirs in increasing order.
	locks [stripes]sync.Mutex
	now   func() time.Time
}

var (
	_ resp.Store             = (*Store)(nil)
	_ resp.ConditionalSetter = (*Store)(nil)
	_ resp.KeyStore          = (*Store)(nil)
	_ resp.Updater           = (*Store)(nil)
)

// New returns n as a resp.KeyStore.
func New(n *node.Node) *Store { return &Store{n: n, h: n.Hierarchy(), now: time.Now} }

func stripe(k index.Key) int { return int(uint64(k.Hash) % stripes) }

// lock takes the write lock of key's block and returns it, for the
// caller to unlock (a mutex, not a function: a method value would be
// allocated on every write).
func (s *Store) lock(k index.Key) *sync.Mutex {
	mu := &s.locks[stripe(k)]
	mu.Lock()
	return mu
}

// expired reports whether a deadline has passed.
func (s *Store) expired(deadline int64) bool {
	return deadline != 0 && s.now().UnixNano() >= deadline
}

// View returns an inline value in place (no copy from DRAM), and a
// chunked one read into one buffer, chunk by chunk, each checked against
// its checksum.
func (s *Store) View(ctx context.Context, key string) ([]byte, func(), error) {
	k := keyOf(ctx, key)
	for range 3 {
		v, rec, err := s.viewRecord(k, key, false)
		if err != nil {
			return nil, nil, err
		}
		if rec.kind == kindInline {
			return rec.value, func() { _ = v.Release() }, nil
		}
		deadline, m := rec.deadline, rec.manifest
		_ = v.Release()
		value, err := s.readChunks(k, m)
		if err == nil {
			return value, func() {}, nil
		}
		if !errors.Is(err, errChunkLost) {
			return nil, nil, err
		}
		// A chunk is gone: the value was replaced meanwhile (read the new
		// one), or eviction took the chunk (the value is lost: drop it).
		if !s.dropIf(k, key, func(r *record) bool {
			return r.kind == kindManifest && r.manifest.gen == m.gen && r.deadline == deadline
		}) {
			continue
		}
		return nil, nil, fmt.Errorf("key %q: part of its value was evicted: %w", key, resp.ErrNotFound)
	}
	return nil, nil, fmt.Errorf("key %q: replaced during three reads in a row: %w", key, resp.ErrNotFound)
}

// viewRecord returns key's record, pinned by the View it returns, or an
// error matching resp.ErrNotFound for a missing, foreign, malformed or
// expired one (which it deletes; locked says the caller holds key's lock).
func (s *Store) viewRecord(k index.Key, key string, locked bool) (tiers.View, record, error) {
	v, _, err := s.n.View(k)
	if err != nil {
		return nil, record{}, respError(err)
	}
	rec, err := decode(v.Bytes())
	switch {
	case err != nil || string(rec.key) != key:
		_ = v.Release()
		return nil, record{}, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
	case s.expired(rec.deadline):
		deadline := rec.deadline
		_ = v.Release()
		if locked {
			s.remove(k, &rec)
		} else {
			s.dropIf(k, key, func(r *record) bool { return r.deadline == deadline })
		}
		return nil, record{}, fmt.Errorf("key %q: expired: %w", key, resp.ErrNotFound)
	}
	return v, rec, nil
}

// current returns key's live record, for a writer that holds its lock;
// ok is false when there is none. The record's key is nil, and its value
// too unless withValue asks for a copy.
func (s *Store) current(k index.Key, key string, withValue bool) (rec record, ok bool, err error) {
	v, rec, err := s.viewRecord(k, key, true)
	if errors.Is(err, resp.ErrNotFound) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	defer v.Release()
	rec.key = nil
	if withValue {
		rec.value = append([]byte(nil), rec.value...)
	} else {
		rec.value = nil
	}
	return rec, true, nil
}

// dropIf deletes key's record and chunks if the record still stands and
// stale says so, under key's lock, and reports whether it did (or found
// the record gone).
func (s *Store) dropIf(k index.Key, key string, stale func(*record) bool) bool {
	defer s.lock(k).Unlock()
	v, _, err := s.n.View(k)
	if err != nil {
		return true
	}
	rec, err := decode(v.Bytes())
	ours := err == nil && string(rec.key) == key
	if ours && stale(&rec) {
		_ = v.Release()
		s.remove(k, &rec)
		return true
	}
	_ = v.Release()
	return !ours
}

// remove deletes key's block and, for a chunked value, its chunks; the
// caller holds key's lock.
func (s *Store) remove(k index.Key, rec *record) error {
	err := s.h.Delete(k)
	if rec != nil && rec.kind == kindManifest {
		s.dropChunks(k, rec.manifest.gen, len(rec.manifest.sums))
	}
	if errors.Is(err, tiers.ErrNotFound) {
		return nil
	}
	return respError(err)
}

// Set stores value, copying it once, straight into the fastest tier.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	_, err := s.SetWith(ctx, key, value, resp.SetOptions{})
	return err
}

// SetIf stores value only if key's presence equals exists (SET … NX: false,
// SET … XX: true). The check and the store are atomic with respect to every
// other write through the Redis protocol — the only writers of its keys.
// An eviction may still remove the key between them; for XX that is the
// same as the eviction coming just after the SET.
func (s *Store) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	cond := resp.SetIfAbsent
	if exists {
		cond = resp.SetIfPresent
	}
	return s.SetWith(ctx, key, value, resp.SetOptions{Cond: cond})
}

// checkKey refuses a key whose record, with the manifest of the largest
// value, could not fit one block.
func (s *Store) checkKey(key string, value int64) error {
	limit := s.n.Config().MaxBlockSize
	need := int64(inlineLen(key, 0))
	if int64(inlineLen(key, int(min(value, limit)))) > limit {
		need = manifestLen(key, chunks(value, limit))
	}
	if need > limit {
		return resp.Mark(&node.LimitError{Msg: fmt.Sprintf("key of %s with the record of a %s value is over the %s block limit (limits.max-block-size)",
			units.FormatBytes(int64(len(key))), units.FormatBytes(value), units.FormatBytes(limit))}, resp.ErrTooLarge)
	}
	return nil
}

// Exists reports whether key holds a live value. It reads the record (a
// chunked value's manifest only); it does not check that every chunk is
// still there, which a GET does.
func (s *Store) Exists(ctx context.Context, key string) (bool, error) {
	v, _, err := s.viewRecord(keyOf(ctx, key), key, false)
	if errors.Is(err, resp.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_ = v.Release()
	return true, nil
}

// Delete removes key, and the chunks of its value, from every tier.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	k := keyOf(ctx, key)
	defer s.lock(k).Unlock()
	rec, ok, err := s.current(k, key, false)
	if err != nil || !ok {
		return false, err
	}
	return true, s.remove(k, &rec)
}

// Len counts the keys stored through the Redis protocol, expired ones
// that no read has met yet included. It walks the node's block table, so
// it costs time in the number of blocks.
func (s *Store) Len(ctx context.Context) (int64, error) {
	ns := namespace(ctx)
	return int64(len(s.h.Blocks(func(b tiers.BlockInfo) bool { return b.Key.NS == ns }))), nil
}

// Info adds the tiers to INFO.
func (s *Store) Info(context.Context) []resp.InfoField {
	hs := s.h.Stats()
	var out []resp.InfoField
	for _, l := range hs.Levels {
		t := l.Kind.String()
		for _, f := range []struct {
			name string
			v    int64
		}{{"capacity_bytes", l.Capacity}, {"used_bytes", l.Used}, {"blocks", l.Blocks}, {"hits", l.Hits},
			{"evictions", l.Evictions}, {"demotions", l.Demotions}, {"promotions", l.Promotions}} {
			out = append(out, resp.InfoField{Section: "tiers", Name: t + "_" + f.name, Value: strconv.FormatInt(f.v, 10)})
		}
	}
	if len(hs.Levels) > 0 {
		out = append(out, resp.InfoField{Section: "memory", Name: "used_memory", Value: strconv.FormatInt(hs.Levels[0].Used, 10)},
			resp.InfoField{Section: "memory", Name: "maxmemory", Value: strconv.FormatInt(hs.Levels[0].Capacity, 10)})
	}
	return out
}

// respError tags the node's errors for the RESP server's replies.
func respError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tiers.ErrNotFound):
		return resp.Mark(err, resp.ErrNotFound)
	case errors.Is(err, tiers.ErrTooLarge), errors.Is(err, node.ErrLimit):
		return resp.Mark(err, resp.ErrTooLarge)
	case errors.Is(err, tiers.ErrFull), errors.Is(err, tiers.ErrNoSpace), errors.Is(err, tiers.ErrQuota):
		return resp.Mark(err, resp.ErrFull)
	case errors.Is(err, tiers.ErrUnavailable):
		return resp.Mark(err, resp.ErrUnavailable)
	}
	return err
}

// namespace is the namespace of the keys a call with ctx reads and
// writes: index.RESPNamespace, bound to the tenant of the identity ctx
// carries when the RESP server authenticates (auth.NamespaceOf). Two
// tenants' keys are so different blocks: neither reads, lists, counts nor
// deletes the other's, and a key of another tenant is a miss like any.
func namespace(ctx context.Context) index.NamespaceID {
	return auth.NamespaceOf(ctx, index.RESPNamespace)
}

// keyOf is the block of key for a call with ctx.
func keyOf(ctx context.Context, key string) index.Key { return keyIn(namespace(ctx), key) }

// keyIn is the block of key in namespace ns: index.RESPKey's hash.
func keyIn(ns index.NamespaceID, key string) index.Key {
	return index.Key{NS: ns, Hash: index.RESPKey(key).Hash}
}

package respnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// staged is a value written but not yet published: its record is filled
// in a reservation, its chunks (if any) are stored under a generation no
// record names yet. commit publishes it; abort leaves the key as it was.
type staged struct {
	k       index.Key
	res     *tiers.PutReservation
	chunked bool
	m       manifest
	old     *record // the record replaced, whose chunks go after commit
}

// stage writes value's chunks, if it needs them, and reserves its record;
// the caller holds key's lock. old is key's record now, if any.
func (s *Store) stage(k index.Key, key string, value []byte, deadline int64, old *record) (*staged, error) {
	limit := s.n.Config().MaxBlockSize
	st := &staged{k: k, old: old}
	hdr := make([]byte, recordHeader+len(key))
	body := value
	if int64(inlineLen(key, len(value))) <= limit {
		putHeader(hdr, kindInline, key, deadline)
	} else {
		m, err := s.writeChunks(k, value, limit)
		if err != nil {
			return nil, err
		}
		st.chunked, st.m = true, m
		rec := encodeManifest(key, deadline, m)
		hdr, body = rec[:len(hdr)], rec[len(hdr):]
	}
	// The record is hashed as it is copied into the reserved room, in one
	// pass over the value, and the Sum set before the commit.
	h := index.Header{Key: k}
	h.Size = uint32(len(hdr) + len(body))
	r, err := s.n.Reserve(h)
	if err != nil {
		st.dropNew(s)
		return nil, respError(err)
	}
	r.SetSum(fill(r.Bytes(), hdr, body))
	st.res = r
	return st, nil
}

// fill copies the record hdr+body into b and returns its checksum, hashing
// each piece as it is copied.
func fill(b, hdr, body []byte) uint64 {
	var d index.Digest
	d.Reset()
	n := index.CopySum(&d, b, hdr)
	index.CopySum(&d, b[n:], body)
	return d.Sum64()
}

func (st *staged) dropNew(s *Store) {
	if st.chunked {
		s.dropChunks(st.k, st.m.gen, len(st.m.sums))
	}
}

// abort gives the reservation back and deletes the new chunks.
func (st *staged) abort(s *Store) {
	st.res.Abort()
	st.dropNew(s)
}

// commit publishes the value, then deletes the chunks of the one it
// replaced.
func (st *staged) commit(s *Store) error {
	if err := st.res.Commit(); err != nil {
		st.dropNew(s)
		return respError(err)
	}
	if o := st.old; o != nil && o.kind == kindManifest && (!st.chunked || o.manifest.gen != st.m.gen) {
		s.dropChunks(st.k, o.manifest.gen, len(o.manifest.sums))
	}
	return nil
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// SetWith stores value under key as opts say (resp.KeyStore). The check
// of opts.Cond and the store happen under key's lock.
func (s *Store) SetWith(ctx context.Context, key string, value []byte, opts resp.SetOptions) (bool, error) {
	if err := s.checkKey(key, int64(len(value))); err != nil {
		return false, err
	}
	k := keyOf(ctx, key)
	defer s.lock(k).Unlock()
	old, ok, err := s.current(k, key, false)
	if err != nil {
		return false, err
	}
	if opts.Cond == resp.SetIfAbsent && ok || opts.Cond == resp.SetIfPresent && !ok {
		return false, nil
	}
	deadline := unixNano(opts.ExpireAt)
	if opts.KeepTTL {
		deadline = old.deadline
	}
	var oldp *record
	if ok {
		oldp = &old
	}
	if s.expired(deadline) { // stored and gone at once
		return true, s.remove(k, oldp)
	}
	st, err := s.stage(k, key, value, deadline, oldp)
	if err != nil {
		return false, err
	}
	return true, st.commit(s)
}

// Apply makes every write of ws or none (resp.KeyStore): it checks every
// size, takes the locks of every key in increasing order, writes the
// chunks and reserves the record of every value, and only then commits
// them, then deletes. A failure before the commits (no room, a key too
// long) gives everything back and leaves every key as it was.
func (s *Store) Apply(ctx context.Context, ws []resp.Write) error {
	last := make(map[string]int, len(ws))
	for i, w := range ws {
		last[w.Key] = i
	}
	var locks [stripes]bool
	for i, w := range ws {
		if last[w.Key] != i {
			continue
		}
		if !w.Delete {
			if err := s.checkKey(w.Key, int64(len(w.Value))); err != nil {
				return err
			}
		}
		locks[stripe(keyOf(ctx, w.Key))] = true
	}
	for i, held := range locks {
		if held {
			s.locks[i].Lock()
			defer s.locks[i].Unlock()
		}
	}
	var puts []*staged
	type del struct {
		k   index.Key
		rec record
	}
	var dels []del
	for i, w := range ws {
		if last[w.Key] != i {
			continue
		}
		k := keyOf(ctx, w.Key)
		old, ok, err := s.current(k, w.Key, false)
		if err == nil && !w.Delete && !s.expired(unixNano(w.ExpireAt)) {
			var oldp *record
			if ok {
				oldp = &old
			}
			var st *staged
			if st, err = s.stage(k, w.Key, w.Value, unixNano(w.ExpireAt), oldp); err == nil {
				puts = append(puts, st)
				continue
			}
		}
		if err != nil {
			for _, st := range puts {
				st.abort(s)
			}
			return err
		}
		if ok {
			dels = append(dels, del{k, old})
		}
	}
	var first error
	for _, st := range puts {
		if err := st.commit(s); err != nil && first == nil {
			first = err
		}
	}
	for _, d := range dels {
		if err := s.remove(d.k, &d.rec); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Stat describes key from its record (resp.KeyStore).
func (s *Store) Stat(ctx context.Context, key string) (resp.KeyInfo, error) {
	v, rec, err := s.viewRecord(keyOf(ctx, key), key, false)
	if err != nil {
		return resp.KeyInfo{}, err
	}
	defer v.Release()
	info := resp.KeyInfo{Size: rec.size(), Footprint: int64(len(v.Bytes())), ExpireAt: fromUnixNano(rec.deadline)}
	if rec.kind == kindManifest {
		info.Footprint += rec.manifest.size
	}
	return info, nil
}

// Expire sets key's deadline by rewriting its record (resp.KeyStore); a
// chunked value's chunks stay as they are.
func (s *Store) Expire(ctx context.Context, key string, at time.Time) (time.Time, error) {
	k := keyOf(ctx, key)
	defer s.lock(k).Unlock()
	rec, ok, err := s.current(k, key, true)
	if err != nil {
		return time.Time{}, err
	}
	if !ok {
		return time.Time{}, fmt.Errorf("key %q: %w", key, resp.ErrNotFound)
	}
	old, d := fromUnixNano(rec.deadline), unixNano(at)
	switch {
	case s.expired(d):
		return old, s.remove(k, &rec)
	case d == rec.deadline:
		return old, nil
	case rec.kind == kindManifest:
		b := encodeManifest(key, d, rec.manifest)
		h := index.Header{Key: k}
		h.Size = uint32(len(b))
		_, err := s.putBlock(h, b)
		return old, err
	}
	st, err := s.stage(k, key, rec.value, d, nil)
	if err != nil {
		return old, err
	}
	return old, st.commit(s)
}

// Scan walks the keys in the order of their hashes (resp.KeyStore): the
// cursor is the top 32 bits of the hash to go on from, so it stays valid
// across writes and leaves the top 32 bits of a uint64 free for a caller
// that walks several stores with one cursor (respcluster puts the node's
// ID there). A page ends only where those 32 bits change, so the few keys
// whose hashes share them are returned together. count bounds the blocks
// read, as Redis's COUNT bounds its work.
func (s *Store) Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error) {
	if count <= 0 {
		count = 10
	}
	if cursor >= 1<<32 {
		return nil, 0, fmt.Errorf("scan cursor %d is over 32 bits, not one this store returned", cursor)
	}
	ns := namespace(ctx)
	bs := s.h.Blocks(func(b tiers.BlockInfo) bool {
		return b.Key.NS == ns && scanCursor(b.Key) >= cursor
	})
	slices.SortFunc(bs, func(a, b tiers.BlockInfo) int {
		return cmpUint64(uint64(a.Key.Hash), uint64(b.Key.Hash))
	})
	var keys []string
	for i, b := range bs {
		if i >= count && scanCursor(b.Key) != scanCursor(bs[i-1].Key) {
			return keys, scanCursor(b.Key), nil // > 0: over the last page's
		}
		if key, ok := s.keyOf(b.Key); ok {
			keys = append(keys, key)
		}
	}
	return keys, 0, nil
}

// scanCursor is the cursor Scan goes on from at block k.
func scanCursor(k index.Key) uint64 { return uint64(k.Hash) >> 32 }

func cmpUint64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// keyOf reads the key a record block holds, if it holds a live record of
// a key that hashes to it.
func (s *Store) keyOf(k index.Key) (string, bool) {
	v, _, err := s.n.View(k)
	if err != nil {
		return "", false
	}
	defer v.Release()
	rec, err := decode(v.Bytes())
	if err != nil || keyIn(k.NS, string(rec.key)) != k || s.expired(rec.deadline) {
		return "", false
	}
	return string(rec.key), true
}

// Flush deletes every key and every chunk (resp.KeyStore) of ctx's
// keyspace — a tenant's own when ctx carries an identity — holding every
// lock, and counts the keys.
func (s *Store) Flush(ctx context.Context) (int64, error) {
	ns := namespace(ctx)
	chunks := chunkSpace(ns)
	for i := range s.locks {
		s.locks[i].Lock()
		defer s.locks[i].Unlock()
	}
	bs := s.h.Blocks(func(b tiers.BlockInfo) bool {
		return b.Key.NS == ns || b.Key.NS == chunks
	})
	var n int64
	var first error
	for _, b := range bs {
		err := s.h.Delete(b.Key)
		switch {
		case err == nil:
			if b.Key.NS == ns {
				n++
			}
		case !errors.Is(err, tiers.ErrNotFound) && first == nil:
			first = respError(err)
		}
	}
	return n, first
}

// Update is an atomic read-modify-write of key (resp.Updater), under
// key's lock: a chunked value is read whole, and the write is staged and
// committed as SetWith's. A value whose chunk was evicted reads as
// missing (and is dropped).
func (s *Store) Update(ctx context.Context, key string, fn func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error)) error {
	if err := s.checkKey(key, 0); err != nil {
		return err
	}
	k := keyOf(ctx, key)
	defer s.lock(k).Unlock()
	rec, ok, err := s.current(k, key, true)
	if err != nil {
		return err
	}
	var old []byte
	var info resp.KeyInfo
	if ok {
		old = rec.value
		if rec.kind == kindManifest {
			old, err = s.readChunks(k, rec.manifest)
			if errors.Is(err, errChunkLost) {
				if err := s.remove(k, &rec); err != nil {
					return err
				}
				old, ok = nil, false
			} else if err != nil {
				return err
			}
		}
		info = resp.KeyInfo{Size: int64(len(old)), ExpireAt: fromUnixNano(rec.deadline)}
	}
	var oldp *record
	if ok {
		oldp = &rec
	}
	w, err := fn(old, info, ok)
	if err != nil {
		return err
	}
	if w.Delete || s.expired(unixNano(w.ExpireAt)) {
		if !ok {
			return nil
		}
		return s.remove(k, oldp)
	}
	if err := s.checkKey(key, int64(len(w.Value))); err != nil {
		return err
	}
	st, err := s.stage(k, key, w.Value, unixNano(w.ExpireAt), oldp)
	if err != nil {
		return err
	}
	return st.commit(s)
}

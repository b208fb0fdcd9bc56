// Package resptest has an in-memory resp.Store, for tests and for trying
// Redis clients against a resp.Server without a kvstrata node behind it.
package resptest

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/internal/units"
)

var (
	_ resp.Store             = (*MemStore)(nil)
	_ resp.ConditionalSetter = (*MemStore)(nil)
	_ resp.KeyStore          = (*MemStore)(nil)
	_ resp.Updater           = (*MemStore)(nil)
)

// MemStore is a resp.Store in a map. Values are copied in on Set and
// handed out without copying by View. A value's bytes are overwritten
// only by a Set of the same key while no view of them is open (so that
// rewriting one key does not churn the garbage collector); a view stays
// valid after the key is replaced or deleted. MemStore counts the views
// not yet released, so tests can check that the server releases every
// one.
//
// MemStore is a resp.KeyStore: keys may have deadlines, read by a clock a
// test can set (SetClock); Apply checks every write before it makes any;
// Scan walks keys in the order they were first stored. Safe for
// concurrent use.
type MemStore struct {
	// MaxValue is the largest value Set accepts, in bytes; a larger one
	// fails with an error matching resp.ErrTooLarge. 0 means no limit. Set
	// it before use.
	MaxValue int64
	// Capacity is the most bytes of values held; a Set that does not fit
	// fails with an error matching resp.ErrFull (MemStore does not evict).
	// 0 means no limit. Set it before use.
	Capacity int64

	mu   sync.Mutex
	m    map[string]*entry
	used int64
	fail error
	now  func() time.Time // the clock deadlines are read by
	seq  uint64           // the scan order of the next new key

	views atomic.Int64
}

// entry is one stored value and the number of views open on it.
type entry struct {
	s     *MemStore
	b     []byte
	views int
	at    time.Time // deadline; zero if none
	seq   uint64    // scan order: kept while the key is present
}

// EntryOverhead is what MemStore counts in a key's Footprint beside its
// key and value bytes.
const EntryOverhead = 64

// release ends one view of e.
func (e *entry) release() {
	e.s.mu.Lock()
	e.views--
	e.s.mu.Unlock()
	e.s.views.Add(-1)
}

// NewMemStore returns an empty store without limits.
func NewMemStore() *MemStore { return &MemStore{m: map[string]*entry{}, now: time.Now, seq: 1} }

// SetClock makes the store read deadlines by now instead of time.Now, so
// that a test can make keys expire without waiting.
func (s *MemStore) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// live returns key's entry, or nil if it is missing or past its deadline
// (an expired entry is deleted on the way). The caller holds s.mu.
func (s *MemStore) live(key string) *entry {
	e := s.m[key]
	if e == nil {
		return nil
	}
	if !e.at.IsZero() && !e.at.After(s.now()) {
		s.deleteLocked(key, e)
		return nil
	}
	return e
}

func (s *MemStore) deleteLocked(key string, e *entry) {
	delete(s.m, key)
	s.used -= int64(len(e.b))
}

// FailWith makes every later call fail with err, until FailWith(nil).
func (s *MemStore) FailWith(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// OpenViews is the number of values View handed out that are not released.
func (s *MemStore) OpenViews() int64 { return s.views.Load() }

// View returns key's stored bytes.
func (s *MemStore) View(ctx context.Context, key string) ([]byte, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, nil, s.fail
	}
	e := s.live(key)
	if e == nil {
		return nil, nil, fmt.Errorf("resptest: get %q: %w", key, resp.ErrNotFound)
	}
	e.views++
	s.views.Add(1)
	return e.b, e.release, nil
}

// Set stores a copy of value under key, without a deadline.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	return s.setLocked(key, value, time.Time{})
}

// SetIf stores a copy of value if key's presence equals exists.
func (s *MemStore) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	if (s.live(key) != nil) != exists {
		return false, nil
	}
	return true, s.setLocked(key, value, time.Time{})
}

// SetWith stores a copy of value as opts say.
func (s *MemStore) SetWith(ctx context.Context, key string, value []byte, opts resp.SetOptions) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	e := s.live(key)
	if opts.Cond == resp.SetIfAbsent && e != nil || opts.Cond == resp.SetIfPresent && e == nil {
		return false, nil
	}
	at := opts.ExpireAt
	if opts.KeepTTL && e != nil {
		at = e.at
	}
	return true, s.setLocked(key, value, at)
}

// check says whether a value of n bytes may replace one of old bytes.
func (s *MemStore) check(n, old, used int64) error {
	if s.MaxValue > 0 && n > s.MaxValue {
		return resp.Mark(fmt.Errorf("resptest: value is %s, over the %s limit", units.FormatBytes(n), units.FormatBytes(s.MaxValue)), resp.ErrTooLarge)
	}
	if s.Capacity > 0 && used-old+n > s.Capacity {
		return fmt.Errorf("resptest: %w: %s of %s used, %s more do not fit", resp.ErrFull, units.FormatBytes(used), units.FormatBytes(s.Capacity), units.FormatBytes(n))
	}
	return nil
}

// setLocked stores value under key with deadline at; a deadline already
// past deletes key instead.
func (s *MemStore) setLocked(key string, value []byte, at time.Time) error {
	n := int64(len(value))
	var old int64
	e := s.live(key)
	if e != nil {
		old = int64(len(e.b))
	}
	if err := s.check(n, old, s.used); err != nil {
		return err
	}
	if !at.IsZero() && !at.After(s.now()) {
		if e != nil {
			s.deleteLocked(key, e)
		}
		return nil
	}
	switch {
	case e != nil && e.views == 0 && cap(e.b) >= len(value):
		e.b = append(e.b[:0], value...) // nobody reads these bytes: reuse them
	case e != nil:
		s.m[key] = &entry{s: s, b: append([]byte(nil), value...), seq: e.seq}
	default:
		s.m[key] = &entry{s: s, b: append([]byte(nil), value...), seq: s.seq}
		s.seq++
	}
	s.m[key].at = at
	s.used += n - old
	return nil
}

// Apply makes every write of ws or, when one fails its checks, none.
func (s *MemStore) Apply(ctx context.Context, ws []resp.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	size := map[string]int64{} // the value sizes as the writes so far leave them
	used := s.used
	for _, w := range ws {
		old, ok := size[w.Key]
		if !ok {
			if e := s.live(w.Key); e != nil {
				old = int64(len(e.b))
			}
		}
		if w.Delete {
			used -= old
			size[w.Key] = 0
			continue
		}
		n := int64(len(w.Value))
		if err := s.check(n, old, used); err != nil {
			return err
		}
		used += n - old
		size[w.Key] = n
	}
	for _, w := range ws {
		if w.Delete {
			if e := s.live(w.Key); e != nil {
				s.deleteLocked(w.Key, e)
			}
			continue
		}
		if err := s.setLocked(w.Key, w.Value, w.ExpireAt); err != nil {
			panic("resptest: a write checked by Apply failed: " + err.Error())
		}
	}
	return nil
}

// Update is an atomic read-modify-write of key (resp.Updater).
func (s *MemStore) Update(ctx context.Context, key string, fn func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	var old []byte
	var info resp.KeyInfo
	e := s.live(key)
	if e != nil {
		old = append([]byte(nil), e.b...)
		info = resp.KeyInfo{Size: int64(len(e.b)), Footprint: int64(len(key)+len(e.b)) + EntryOverhead, ExpireAt: e.at}
	}
	w, err := fn(old, info, e != nil)
	switch {
	case err != nil:
		return err
	case w.Delete:
		if e != nil {
			s.deleteLocked(key, e)
		}
		return nil
	}
	return s.setLocked(key, w.Value, w.ExpireAt)
}

// Stat describes key.
func (s *MemStore) Stat(ctx context.Context, key string) (resp.KeyInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return resp.KeyInfo{}, s.fail
	}
	e := s.live(key)
	if e == nil {
		return resp.KeyInfo{}, fmt.Errorf("resptest: stat %q: %w", key, resp.ErrNotFound)
	}
	n := int64(len(e.b))
	return resp.KeyInfo{Size: n, Footprint: int64(len(key)) + n + EntryOverhead, ExpireAt: e.at}, nil
}

// Expire sets key's deadline; one not after now deletes it.
func (s *MemStore) Expire(ctx context.Context, key string, at time.Time) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return time.Time{}, s.fail
	}
	e := s.live(key)
	if e == nil {
		return time.Time{}, fmt.Errorf("resptest: expire %q: %w", key, resp.ErrNotFound)
	}
	old := e.at
	e.at = at
	if !at.IsZero() && !at.After(s.now()) {
		s.deleteLocked(key, e)
	}
	return old, nil
}

// Scan returns up to count keys in the order they were first stored,
// from cursor on; the cursor is the order of the next key to return, so
// keys stored or deleted meanwhile do not make it skip any.
func (s *MemStore) Scan(ctx context.Context, cursor uint64, count int) ([]string, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, 0, s.fail
	}
	count = max(count, 1)
	type ordered struct {
		key string
		seq uint64
	}
	var after []ordered
	now := s.now()
	for k, e := range s.m {
		if e.seq >= cursor && (e.at.IsZero() || e.at.After(now)) {
			after = append(after, ordered{k, e.seq})
		}
	}
	sort.Slice(after, func(i, j int) bool { return after[i].seq < after[j].seq })
	if len(after) <= count {
		keys := make([]string, len(after))
		for i, o := range after {
			keys[i] = o.key
		}
		return keys, 0, nil
	}
	keys := make([]string, count)
	for i, o := range after[:count] {
		keys[i] = o.key
	}
	return keys, after[count].seq, nil
}

// Flush deletes every key.
func (s *MemStore) Flush(ctx context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	n := s.countLocked()
	clear(s.m)
	s.used = 0
	return n, nil
}

// countLocked is the number of keys not past their deadline.
func (s *MemStore) countLocked() int64 {
	var n int64
	now := s.now()
	for _, e := range s.m {
		if e.at.IsZero() || e.at.After(now) {
			n++
		}
	}
	return n
}

// Exists reports whether key is stored.
func (s *MemStore) Exists(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	return s.live(key) != nil, nil
}

// Delete removes key.
func (s *MemStore) Delete(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	e := s.live(key)
	if e != nil {
		s.deleteLocked(key, e)
	}
	return e != nil, nil
}

// Len is the number of keys stored.
func (s *MemStore) Len(ctx context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	return s.countLocked(), nil
}

// Info reports the bytes held (memory section) and the limits (a
// "memstore" section).
func (s *MemStore) Info(ctx context.Context) []resp.InfoField {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []resp.InfoField{
		{Section: "memory", Name: "memstore_used_bytes", Value: fmt.Sprint(s.used)},
		{Section: "memstore", Name: "capacity_bytes", Value: fmt.Sprint(s.Capacity)},
		{Section: "memstore", Name: "max_value_bytes", Value: fmt.Sprint(s.MaxValue)},
		{Section: "memstore", Name: "open_views", Value: fmt.Sprint(s.views.Load())},
	}
}

// Package resptest has an in-memory resp.Store, for tests and for trying
// Redis clients against a resp.Server without a kvstrata node behind it.
package resptest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/internal/units"
)

var (
	_ resp.Store             = (*MemStore)(nil)
	_ resp.ConditionalSetter = (*MemStore)(nil)
)

// MemStore is a resp.Store in a map. Values are copied in on Set and
// handed out without copying by View. A value's bytes are overwritten
// only by a Set of the same key while no view of them is open (so that
// rewriting one key does not churn the garbage collector); a view stays
// valid after the key is replaced or deleted. MemStore counts the views
// not yet released, so tests can check that the server releases every
// one. Safe for concurrent use.
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

	views atomic.Int64
}

// entry is one stored value and the number of views open on it.
type entry struct {
	s     *MemStore
	b     []byte
	views int
}

// release ends one view of e.
func (e *entry) release() {
	e.s.mu.Lock()
	e.views--
	e.s.mu.Unlock()
	e.s.views.Add(-1)
}

// NewMemStore returns an empty store without limits.
func NewMemStore() *MemStore { return &MemStore{m: map[string]*entry{}} }

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
	e, ok := s.m[key]
	if !ok {
		return nil, nil, fmt.Errorf("resptest: get %q: %w", key, resp.ErrNotFound)
	}
	e.views++
	s.views.Add(1)
	return e.b, e.release, nil
}

// Set stores a copy of value under key.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setLocked(key, value)
}

// SetIf stores a copy of value if key's presence equals exists.
func (s *MemStore) SetIf(ctx context.Context, key string, value []byte, exists bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	if _, ok := s.m[key]; ok != exists {
		return false, nil
	}
	return true, s.setLocked(key, value)
}

func (s *MemStore) setLocked(key string, value []byte) error {
	if s.fail != nil {
		return s.fail
	}
	n := int64(len(value))
	if s.MaxValue > 0 && n > s.MaxValue {
		return resp.Mark(fmt.Errorf("resptest: value is %s, over the %s limit", units.FormatBytes(n), units.FormatBytes(s.MaxValue)), resp.ErrTooLarge)
	}
	var old int64
	e := s.m[key]
	if e != nil {
		old = int64(len(e.b))
	}
	if s.Capacity > 0 && s.used-old+n > s.Capacity {
		return fmt.Errorf("resptest: %w: %s of %s used, %s more do not fit", resp.ErrFull, units.FormatBytes(s.used), units.FormatBytes(s.Capacity), units.FormatBytes(n))
	}
	if e != nil && e.views == 0 && cap(e.b) >= len(value) {
		e.b = append(e.b[:0], value...) // nobody reads these bytes: reuse them
	} else {
		s.m[key] = &entry{s: s, b: append([]byte(nil), value...)}
	}
	s.used += n - old
	return nil
}

// Exists reports whether key is stored.
func (s *MemStore) Exists(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	_, ok := s.m[key]
	return ok, nil
}

// Delete removes key.
func (s *MemStore) Delete(ctx context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return false, s.fail
	}
	e, ok := s.m[key]
	if ok {
		delete(s.m, key)
		s.used -= int64(len(e.b))
	}
	return ok, nil
}

// Len is the number of keys stored.
func (s *MemStore) Len(ctx context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	return int64(len(s.m)), nil
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

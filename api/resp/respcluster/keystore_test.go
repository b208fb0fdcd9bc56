package respcluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respcluster"
	"github.com/kvstrata/kvstrata/api/resp/resptest"
)

// keyMem is a small resp.KeyStore in a map, with deadlines: the local
// store of the tests of the KeyStore wrapper.
type keyMem struct {
	mu sync.Mutex
	m  map[string]item
}

type item struct {
	v  []byte
	at time.Time
}

var _ resp.KeyStore = (*keyMem)(nil)

func newKeyMem() resp.Store { return &keyMem{m: map[string]item{}} }

// get returns key's live item; the caller holds mu.
func (s *keyMem) get(key string) (item, bool) {
	it, ok := s.m[key]
	if ok && !it.at.IsZero() && !it.at.After(time.Now()) {
		delete(s.m, key)
		return item{}, false
	}
	return it, ok
}

func notFound(key string) error { return fmt.Errorf("key %q: %w", key, resp.ErrNotFound) }

func (s *keyMem) View(_ context.Context, key string) ([]byte, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.get(key)
	if !ok {
		return nil, nil, notFound(key)
	}
	return slices.Clone(it.v), func() {}, nil
}

func (s *keyMem) Set(ctx context.Context, key string, value []byte) error {
	_, err := s.SetWith(ctx, key, value, resp.SetOptions{})
	return err
}

func (s *keyMem) Exists(_ context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.get(key)
	return ok, nil
}

func (s *keyMem) Delete(_ context.Context, key string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.get(key)
	delete(s.m, key)
	return ok, nil
}

func (s *keyMem) Len(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.m)), nil
}

func (s *keyMem) Info(context.Context) []resp.InfoField { return nil }

func (s *keyMem) SetWith(_ context.Context, key string, value []byte, opts resp.SetOptions) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.get(key)
	if opts.Cond == resp.SetIfAbsent && ok || opts.Cond == resp.SetIfPresent && !ok {
		return false, nil
	}
	at := opts.ExpireAt
	if opts.KeepTTL {
		at = old.at
	}
	s.m[key] = item{v: slices.Clone(value), at: at}
	return true, nil
}

func (s *keyMem) Apply(_ context.Context, ws []resp.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		if w.Delete {
			delete(s.m, w.Key)
		} else {
			s.m[w.Key] = item{v: slices.Clone(w.Value), at: w.ExpireAt}
		}
	}
	return nil
}

func (s *keyMem) Stat(_ context.Context, key string) (resp.KeyInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.get(key)
	if !ok {
		return resp.KeyInfo{}, notFound(key)
	}
	return resp.KeyInfo{Size: int64(len(it.v)), Footprint: int64(len(key) + len(it.v)), ExpireAt: it.at}, nil
}

func (s *keyMem) Expire(_ context.Context, key string, at time.Time) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.get(key)
	if !ok {
		return time.Time{}, notFound(key)
	}
	if !at.IsZero() && !at.After(time.Now()) {
		delete(s.m, key)
		return it.at, nil
	}
	s.m[key] = item{v: it.v, at: at}
	return it.at, nil
}

func (s *keyMem) Scan(_ context.Context, cursor uint64, _ int) ([]string, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.m {
		keys = append(keys, k)
	}
	return keys, 0, nil
}

func (s *keyMem) Flush(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(s.m))
	clear(s.m)
	return n, nil
}

// keyCluster starts two nodes whose own keys are in keyMems, and returns
// their cluster-wide KeyStores, by node id - 1.
func keyCluster(t *testing.T) (*cluster, [2]resp.KeyStore) {
	c := newClusterOf(t, 2, 20*time.Second, newKeyMem)
	var ks [2]resp.KeyStore
	for id, s := range c.stores {
		k, ok := s.(resp.KeyStore)
		if !ok {
			t.Fatalf("node %d's store %T lost the local store's KeyStore", id, s)
		}
		ks[id-1] = k
	}
	return c, ks
}

func TestKeyStoreConditionsJudgeTheWholeCluster(t *testing.T) {
	c, ks := keyCluster(t)
	k := c.key("prompt:1")
	hour := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if _, err := ks[0].SetWith(ctx(t), k, []byte("first"), resp.SetOptions{ExpireAt: hour}); err != nil {
		t.Fatal(err)
	}
	if stored, err := ks[1].SetWith(ctx(t), k, []byte("nx"), resp.SetOptions{Cond: resp.SetIfAbsent}); stored || err != nil {
		t.Fatalf("SET NX through node 2 of node 1's key = %v, %v; want not stored", stored, err)
	}
	// Stat and TTL through node 2 describe node 1's value.
	if ki, err := ks[1].Stat(ctx(t), k); err != nil || ki.Size != 5 || !ki.ExpireAt.Equal(hour) {
		t.Fatalf("Stat through node 2 = %+v, %v; want 5 bytes until %v", ki, err, hour)
	}
	// XX with KEEPTTL through node 2: stored there, node 1's deadline kept,
	// node 1's copy gone.
	if stored, err := ks[1].SetWith(ctx(t), k, []byte("xx"), resp.SetOptions{Cond: resp.SetIfPresent, KeepTTL: true}); !stored || err != nil {
		t.Fatalf("SET XX KEEPTTL through node 2 = %v, %v; want stored", stored, err)
	}
	if ki, err := c.locals[2].(resp.KeyStore).Stat(ctx(t), k); err != nil || !ki.ExpireAt.Equal(hour) {
		t.Fatalf("node 2's copy: %+v, %v; want the deadline %v kept", ki, err, hour)
	}
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds the value SET XX replaced")
	}
	mustGet(t, ks[0], k, "xx")
}

func TestKeyStoreApplyReplacesOtherNodesCopies(t *testing.T) {
	c, ks := keyCluster(t)
	a, b := c.key("a"), c.key("b")
	for _, k := range []string{a, b} {
		if err := ks[0].Set(ctx(t), k, []byte("old")); err != nil {
			t.Fatal(err)
		}
	}
	if err := ks[1].Apply(ctx(t), []resp.Write{{Key: a, Value: []byte("new")}, {Key: b, Delete: true}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range ks {
		mustGet(t, s, a, "new")
		mustMiss(t, s, b)
	}
}

func TestKeyStoreExpireOfAnotherNodesKeyBindsTheOnlyCopy(t *testing.T) {
	c, ks := keyCluster(t)
	k := c.key("prompt:1")
	if err := ks[0].Set(ctx(t), k, []byte("v")); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if old, err := ks[1].Expire(ctx(t), k, at); err != nil || !old.IsZero() {
		t.Fatalf("EXPIRE through node 2 = %v, %v; want no old deadline", old, err)
	}
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds a copy without the deadline")
	}
	if ki, err := ks[0].Stat(ctx(t), k); err != nil || !ki.ExpireAt.Equal(at) {
		t.Fatalf("TTL through node 1 = %+v, %v; want %v", ki, err, at)
	}
	// A deadline already past deletes it everywhere.
	if err := ks[0].Set(ctx(t), k, []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := ks[1].Expire(ctx(t), k, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, s := range ks {
		mustMiss(t, s, k)
	}
	if _, err := ks[1].Expire(ctx(t), c.key("none"), at); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("EXPIRE of a key nowhere: %v; want ErrNotFound", err)
	}
}

// A read-modify-write through one node of a key another node wrote a
// moment ago — before the directory lists that node — continues from the
// other node's value and leaves the one copy, not a fresh value beside
// the old one.
func TestUpdateFindsACopyTheDirectoryDoesNotListYet(t *testing.T) {
	c := newClusterOf(t, 3, 20*time.Second, func() resp.Store { return resptest.NewMemStore() })
	k := c.key("counter")
	if err := c.locals[1].Set(ctx(t), k, []byte("41")); err != nil {
		t.Fatal(err)
	}
	c.pin(k) // the directory lists no holder yet
	incr := func(old []byte, info resp.KeyInfo, found bool) (resp.Write, error) {
		n := 0
		if found {
			var err error
			if n, err = strconv.Atoi(string(old)); err != nil {
				return resp.Write{}, err
			}
		}
		return resp.Write{Value: []byte(strconv.Itoa(n + 1))}, nil
	}
	if err := c.stores[2].(resp.Updater).Update(ctx(t), k, incr); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.locals[1].Exists(ctx(t), k); ok {
		t.Fatal("node 1 still holds the old value beside node 2's new one")
	}
	c.pin(k, respcluster.Holder{Node: 2, Up: true})
	for _, s := range c.stores {
		mustGet(t, s, k, "42")
	}
	// A key no member holds starts from nothing, even while a member
	// that holds nothing listed does not answer.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.setAddr(9, l.Addr().String())
	l.Close() // nothing listens there
	n := c.key("new")
	if err := c.stores[3].(resp.Updater).Update(ctx(t), n, incr); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c.stores[3], n, "1")
}

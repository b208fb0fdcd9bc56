package raftstore_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/kvstrata/kvstrata/raftstore"
	"github.com/kvstrata/kvstrata/raftstore/storetest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// pebbleStores opens Pebble stores in temporary directories; opts may be
// nil. Each store remembers its directory so that it can be reopened.
type pebbleStores struct{ opts *raftstore.Options }

type dirStore struct {
	*raftstore.LogStore
	dir string
}

func (p pebbleStores) open(t testing.TB, dir string) storetest.Store {
	t.Helper()
	o := raftstore.Options{Logger: quiet}
	if p.opts != nil {
		o = *p.opts
		o.Logger = quiet
	}
	s, err := raftstore.Open(dir, &o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil && !errors.Is(err, raftstore.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return dirStore{s, dir}
}

func (p pebbleStores) new(t testing.TB) storetest.Store { return p.open(t, t.TempDir()) }

func (p pebbleStores) reopen(t testing.TB, s storetest.Store) storetest.Store {
	ds := s.(dirStore)
	if err := ds.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return p.open(t, ds.dir)
}

func inmemStore(testing.TB) storetest.Store { return raft.NewInmemStore() }

func TestInmemStoreConformance(t *testing.T) {
	storetest.Run(t, inmemStore, nil)
}

func TestPebbleStoreConformance(t *testing.T) {
	p := pebbleStores{}
	storetest.Run(t, p.new, p.reopen)
}

func TestOpenRejectsAPebbleStoreThatIsNoRaftLog(t *testing.T) {
	dir := t.TempDir()
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("some key"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := raftstore.Open(dir, &raftstore.Options{Logger: quiet}); !errors.Is(err, raftstore.ErrCorrupt) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open of a foreign Pebble store = %v, want ErrCorrupt", err)
	}
}

func TestOpenReportsEveryBadOption(t *testing.T) {
	_, err := raftstore.Open(t.TempDir(), &raftstore.Options{CacheSize: -1, MemTableSize: 10})
	if err == nil {
		t.Fatal("bad options accepted")
	}
	for _, want := range []string{"CacheSize", "MemTableSize"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestStoreUsedAfterCloseFails(t *testing.T) {
	s, err := raftstore.Open(t.TempDir(), &raftstore.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLog(&raft.Log{Index: 1}); !errors.Is(err, raftstore.ErrClosed) {
		t.Fatalf("StoreLog after Close = %v, want ErrClosed", err)
	}
	if err := s.GetLog(1, new(raft.Log)); !errors.Is(err, raftstore.ErrClosed) {
		t.Fatalf("GetLog after Close = %v, want ErrClosed", err)
	}
}

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)              {}
func (quietPebble) Errorf(string, ...any)             {}
func (quietPebble) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// BenchmarkLogStore compares the Pebble store, synced and not, with
// raft-boltdb's BoltStore, the reference raft log store, side by side:
//
//	go test -run '^$' -bench LogStore -benchtime 2000x ./raftstore
func BenchmarkLogStore(b *testing.B) {
	b.Run("pebble", func(b *testing.B) { storetest.Bench(b, pebbleStores{}.new) })
	b.Run("pebble-nosync", func(b *testing.B) {
		storetest.Bench(b, pebbleStores{opts: &raftstore.Options{NoSync: true}}.new)
	})
	b.Run("bolt", func(b *testing.B) { storetest.Bench(b, newBolt) })
}

func newBolt(t testing.TB) storetest.Store {
	s, err := raftboltdb.NewBoltStore(filepath.Join(t.TempDir(), "raft.db"))
	if err != nil {
		t.Fatalf("NewBoltStore: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

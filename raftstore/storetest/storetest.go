// Package storetest is one conformance suite and one benchmark set for
// every raft.LogStore + raft.StableStore: raft.InmemStore, raftstore's
// Pebble store, raft-boltdb. A store passes when it behaves as
// raft.InmemStore does in everything raft relies on.
//
// Run and Bench start a fresh store for each test through the caller's
// functions; the tests of one Run call run one after another.
package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// Store is what raft needs from its log and stable store.
type Store interface {
	raft.LogStore
	raft.StableStore
}

// NewFunc returns an empty store; the function arranges, with t.Cleanup,
// for the store to be closed.
type NewFunc func(t testing.TB) Store

// ReopenFunc closes s and opens it again from what it persisted.
type ReopenFunc func(t testing.TB, s Store) Store

// Run runs the suite against the stores newStore returns. reopen is nil
// for a store that does not persist; the durability tests are then skipped.
func Run(t *testing.T, newStore NewFunc, reopen ReopenFunc) {
	tests := []struct {
		name string
		fn   func(*testing.T, NewFunc, ReopenFunc)
	}{
		{"EmptyStoreHasNoIndexes", testEmpty},
		{"StoreAndGetOneEntryKeepsEveryField", testStoreGetOne},
		{"StoreAndGetBatch", testStoreGetBatch},
		{"GetMissingIsErrLogNotFound", testGetMissing},
		{"DeleteRangeOfHead", testDeleteHead},
		{"DeleteRangeOfTail", testDeleteTail},
		{"DeleteRangeInMiddleKeepsEnds", testDeleteMiddle},
		{"DeleteRangeOfEverything", testDeleteAll},
		{"StableValues", testStable},
		{"StableMissingKeys", testStableMissing},
		{"LargeEntries", testLarge},
		{"ConcurrentReadersWhileAppending", testConcurrentReaders},
		{"ReopenKeepsLogsAndStableValues", testReopen},
		{"ReopenAfterDeleteRangeKeepsIndexes", testReopenAfterDelete},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore, reopen) })
	}
}

// entry returns the test entry of index i: every field set, and bytes
// that depend on i.
func entry(i uint64) *raft.Log {
	return &raft.Log{
		Index:      i,
		Term:       i/10 + 1,
		Type:       raft.LogType(i % 6),
		Data:       fmt.Appendf(nil, "data of entry %d", i),
		Extensions: fmt.Appendf(nil, "ext %d", i),
		AppendedAt: time.Unix(1_700_000_000+int64(i), int64(i)*1000+7),
	}
}

// entries returns entry(from) … entry(to).
func entries(from, to uint64) []*raft.Log {
	var ls []*raft.Log
	for i := from; i <= to; i++ {
		ls = append(ls, entry(i))
	}
	return ls
}

func store(t testing.TB, s Store, logs []*raft.Log) {
	t.Helper()
	if err := s.StoreLogs(logs); err != nil {
		t.Fatalf("StoreLogs: %v", err)
	}
}

// sameLog reports how got differs from want, "" when it does not.
func sameLog(got, want *raft.Log) string {
	switch {
	case got.Index != want.Index, got.Term != want.Term, got.Type != want.Type:
		return fmt.Sprintf("index/term/type %d/%d/%v, want %d/%d/%v", got.Index, got.Term, got.Type, want.Index, want.Term, want.Type)
	case !bytes.Equal(got.Data, want.Data):
		return fmt.Sprintf("data %.40q, want %.40q", got.Data, want.Data)
	case !bytes.Equal(got.Extensions, want.Extensions):
		return fmt.Sprintf("extensions %q, want %q", got.Extensions, want.Extensions)
	case !got.AppendedAt.Equal(want.AppendedAt):
		return fmt.Sprintf("appended at %v, want %v", got.AppendedAt, want.AppendedAt)
	}
	return ""
}

// checkLog checks that s holds want.
func checkLog(t testing.TB, s Store, want *raft.Log) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(want.Index, &got); err != nil {
		t.Fatalf("GetLog(%d): %v", want.Index, err)
	}
	if d := sameLog(&got, want); d != "" {
		t.Fatalf("GetLog(%d): %s", want.Index, d)
	}
}

// checkMissing checks that s holds no entry i.
func checkMissing(t testing.TB, s Store, i uint64) {
	t.Helper()
	var got raft.Log
	if err := s.GetLog(i, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(%d) = %v, want raft.ErrLogNotFound", i, err)
	}
}

// checkIndexes checks FirstIndex and LastIndex.
func checkIndexes(t testing.TB, s Store, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil {
		t.Fatalf("FirstIndex: %v", err)
	}
	l, err := s.LastIndex()
	if err != nil {
		t.Fatalf("LastIndex: %v", err)
	}
	if f != first || l != last {
		t.Fatalf("first, last = %d, %d; want %d, %d", f, l, first, last)
	}
}

func testEmpty(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	checkIndexes(t, s, 0, 0)
	checkMissing(t, s, 0)
	checkMissing(t, s, 1)
}

func testStoreGetOne(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	want := entry(7)
	if err := s.StoreLog(want); err != nil {
		t.Fatalf("StoreLog: %v", err)
	}
	checkIndexes(t, s, 7, 7)
	checkLog(t, s, want)
	// An entry with nothing but an index comes back empty.
	bare := &raft.Log{Index: 8}
	if err := s.StoreLog(bare); err != nil {
		t.Fatalf("StoreLog: %v", err)
	}
	checkLog(t, s, bare)
}

func testStoreGetBatch(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 100))
	store(t, s, entries(101, 150))
	checkIndexes(t, s, 1, 150)
	for i := uint64(1); i <= 150; i++ {
		checkLog(t, s, entry(i))
	}
}

func testGetMissing(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(10, 20))
	for _, i := range []uint64{0, 9, 21, 1 << 40} {
		checkMissing(t, s, i)
	}
}

func testDeleteHead(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 20))
	if err := s.DeleteRange(1, 5); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	checkIndexes(t, s, 6, 20)
	checkMissing(t, s, 5)
	checkLog(t, s, entry(6))
}

func testDeleteTail(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 20))
	if err := s.DeleteRange(15, 20); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	checkIndexes(t, s, 1, 14)
	checkMissing(t, s, 15)
	checkLog(t, s, entry(14))
	// Raft truncates a conflicting tail and appends new entries there.
	store(t, s, entries(15, 16))
	checkIndexes(t, s, 1, 16)
}

func testDeleteMiddle(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 20))
	if err := s.DeleteRange(8, 10); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	checkIndexes(t, s, 1, 20)
	for _, i := range []uint64{8, 9, 10} {
		checkMissing(t, s, i)
	}
	checkLog(t, s, entry(7))
	checkLog(t, s, entry(11))
}

func testDeleteAll(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 20))
	if err := s.DeleteRange(1, 20); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	checkIndexes(t, s, 0, 0)
	checkMissing(t, s, 1)
	// After a snapshot install the log starts again further on.
	store(t, s, entries(100, 101))
	checkIndexes(t, s, 100, 101)
}

func testStable(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	if err := s.Set([]byte("vote"), []byte("node-2")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if err := s.Set([]byte("vote"), []byte("node-3")); err != nil {
		t.Fatalf("Set again: %v", err)
	}
	v, err := s.Get([]byte("vote"))
	if err != nil || string(v) != "node-3" {
		t.Fatalf("Get = %q, %v; want the last value set", v, err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 1<<40+3); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}
	if n, err := s.GetUint64([]byte("CurrentTerm")); err != nil || n != 1<<40+3 {
		t.Fatalf("GetUint64 = %d, %v", n, err)
	}
}

func testStableMissing(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	// Raft tells a missing key from a failure by the error's text.
	if v, err := s.Get([]byte("missing")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key = %q, %v; want the error \"not found\"", v, err)
	}
	if n, err := s.GetUint64([]byte("missing")); err != nil || n != 0 {
		t.Fatalf("GetUint64 of a missing key = %d, %v; want 0, nil", n, err)
	}
}

func testLarge(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	rng := rand.NewChaCha8([32]byte{1})
	var logs []*raft.Log
	for i := range uint64(3) {
		l := entry(i + 1)
		l.Data = make([]byte, 4<<20+int(i))
		_, _ = rng.Read(l.Data)
		l.Extensions = bytes.Repeat([]byte{byte(i)}, 64<<10)
		logs = append(logs, l)
	}
	store(t, s, logs)
	for _, l := range logs {
		checkLog(t, s, l)
	}
}

func testConcurrentReaders(t *testing.T, newStore NewFunc, _ ReopenFunc) {
	s := newStore(t)
	store(t, s, entries(1, 10))
	const appends = 200
	var wg sync.WaitGroup
	done := make(chan struct{})
	for r := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			for {
				select {
				case <-done:
					return
				default:
				}
				last, err := s.LastIndex()
				if err != nil {
					t.Errorf("LastIndex: %v", err)
					return
				}
				i := 1 + rng.Uint64N(last)
				var got raft.Log
				if err := s.GetLog(i, &got); err != nil {
					t.Errorf("GetLog(%d) with last index %d: %v", i, last, err)
					return
				}
				if d := sameLog(&got, entry(i)); d != "" {
					t.Errorf("GetLog(%d): %s", i, d)
					return
				}
			}
		})
	}
	for i := uint64(11); i <= 10+appends; i++ {
		store(t, s, []*raft.Log{entry(i)})
	}
	close(done)
	wg.Wait()
	checkIndexes(t, s, 1, 10+appends)
}

func testReopen(t *testing.T, newStore NewFunc, reopen ReopenFunc) {
	if reopen == nil {
		t.Skip("the store does not persist")
	}
	s := newStore(t)
	store(t, s, entries(1, 50))
	if err := s.SetUint64([]byte("CurrentTerm"), 9); err != nil {
		t.Fatalf("SetUint64: %v", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("node-1")); err != nil {
		t.Fatalf("Set: %v", err)
	}
	s = reopen(t, s)
	checkIndexes(t, s, 1, 50)
	for i := uint64(1); i <= 50; i++ {
		checkLog(t, s, entry(i))
	}
	if n, err := s.GetUint64([]byte("CurrentTerm")); err != nil || n != 9 {
		t.Fatalf("GetUint64 after reopen = %d, %v; want 9", n, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-1" {
		t.Fatalf("Get after reopen = %q, %v", v, err)
	}
}

func testReopenAfterDelete(t *testing.T, newStore NewFunc, reopen ReopenFunc) {
	if reopen == nil {
		t.Skip("the store does not persist")
	}
	s := newStore(t)
	store(t, s, entries(1, 50))
	if err := s.DeleteRange(1, 30); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	if err := s.DeleteRange(45, 50); err != nil {
		t.Fatalf("DeleteRange: %v", err)
	}
	s = reopen(t, s)
	checkIndexes(t, s, 31, 44)
	checkMissing(t, s, 30)
	checkMissing(t, s, 45)
	checkLog(t, s, entry(31))
}

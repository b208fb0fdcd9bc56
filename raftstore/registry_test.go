package raftstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/raftstore"
)

func workerRec(i int, expires time.Time) raftstore.Worker {
	return raftstore.Worker{
		URL: fmt.Sprintf("http://10.0.1.%d:8000", i), Events: fmt.Sprintf("tcp://10.0.1.%d:5557", i),
		Replay: fmt.Sprintf("tcp://10.0.1.%d:5558", i), Role: "aggregated", Model: "kvstrata-sim",
		Namespace: 0xfeed, BlockTokens: 16, PoolBlocks: 4096, Expires: expires,
	}
}

func urls(ws []raftstore.Worker) string {
	var s []string
	for _, w := range ws {
		s = append(s, w.URL)
	}
	return strings.Join(s, " ")
}

func TestFSMRegistersRenewsAndDeregistersWorkers(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(2, t0.Add(10*time.Second))))
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0.Add(5*time.Second))))
	if got, want := urls(a.f.Workers(t0)), "http://10.0.1.1:8000 http://10.0.1.2:8000"; got != want {
		t.Fatalf("Workers = %q, want %q", got, want)
	}
	if w, ok := a.f.Worker("http://10.0.1.1:8000"); !ok || w != workerRec(1, t0.Add(5*time.Second)) {
		t.Fatalf("Worker(1) = %+v %v, want the record as registered", w, ok)
	}
	// A reader hides a lease that ended by its clock before any sweep.
	if got := urls(a.f.Workers(t0.Add(5 * time.Second))); got != "http://10.0.1.2:8000" {
		t.Fatalf("Workers at the end of worker 1's lease = %q, want worker 2 alone", got)
	}
	// A renewal moves the lease.
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0.Add(20*time.Second))))
	if got := len(a.f.Workers(t0.Add(15 * time.Second))); got != 1 {
		t.Fatalf("after worker 1's renewal, %d workers at t0+15s, want 1 (worker 1)", got)
	}
	a.ok(raftstore.EncodeWorkerRemove("http://10.0.1.1:8000"))
	a.ok(raftstore.EncodeWorkerRemove("http://10.0.1.1:8000")) // twice: no error
	if got := urls(a.f.Workers(time.Time{})); got != "http://10.0.1.2:8000" {
		t.Fatalf("after deregistering worker 1, Workers = %q", got)
	}
}

func TestFSMExpiresWorkersByTheCutoffInTheEntry(t *testing.T) {
	a := newApplier(t)
	for i := 1; i <= 3; i++ {
		a.ok(raftstore.EncodeWorkerUpsert(workerRec(i, t0.Add(time.Duration(i)*time.Second))))
	}
	if !a.f.WorkersExpired(t0.Add(2 * time.Second)) {
		t.Fatal("WorkersExpired at t0+2s = false, want true (workers 1 and 2)")
	}
	// The cutoff is the entry's, not the replica's clock: the same entry
	// drops the same records on every replica whenever it is applied.
	a.ok(raftstore.EncodeWorkerExpire(t0.Add(2 * time.Second)))
	if got := urls(a.f.Workers(time.Time{})); got != "http://10.0.1.3:8000" {
		t.Fatalf("after expiring at t0+2s the registry holds %q, want worker 3 alone", got)
	}
	if a.f.WorkersExpired(t0.Add(2 * time.Second)) {
		t.Fatal("WorkersExpired at t0+2s after the sweep = true")
	}
	// A stale sweep (an earlier cutoff, applied late) drops nothing renewed.
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0.Add(time.Minute))))
	a.ok(raftstore.EncodeWorkerExpire(t0.Add(time.Second)))
	if got := len(a.f.Workers(time.Time{})); got != 2 {
		t.Fatalf("a stale sweep left %d workers, want 2", got)
	}
}

func TestFSMRegistryIsBoundedAndRefusesWithoutChange(t *testing.T) {
	a := newApplier(t)
	for i := range raftstore.MaxWorkers {
		a.ok(raftstore.EncodeWorkerUpsert(workerRec(i, t0.Add(time.Minute))))
	}
	res := a.apply(raftstore.EncodeWorkerUpsert(workerRec(raftstore.MaxWorkers, t0.Add(time.Minute))))
	if err, _ := res.(error); !errors.Is(err, raftstore.ErrRegistryFull) {
		t.Fatalf("registering worker %d: result %v, want ErrRegistryFull", raftstore.MaxWorkers+1, res)
	}
	if n := len(a.f.Workers(time.Time{})); n != raftstore.MaxWorkers {
		t.Fatalf("a full registry holds %d workers after a refused upsert, want %d", n, raftstore.MaxWorkers)
	}
	// A registered worker still renews.
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(0, t0.Add(time.Hour))))
}

func TestValidateEntryRefusesBadWorkerRecords(t *testing.T) {
	huge := strings.Repeat("x", raftstore.MaxWorkerField+1)
	bad := map[string]raftstore.Worker{
		"empty URL":          {},
		"huge URL":           {URL: "http://" + huge},
		"huge model":         {URL: "http://a:1", Model: huge},
		"huge events":        {URL: "http://a:1", Events: huge},
		"unknown role":       {URL: "http://a:1", Role: "janitor"},
		"replay, no events":  {URL: "http://a:1", Replay: "tcp://a:2"},
		"huge role":          {URL: "http://a:1", Role: huge},
		"huge replay events": {URL: "http://a:1", Events: "tcp://a:2", Replay: huge},
	}
	for name, w := range bad {
		if err := raftstore.ValidateEntry(raftstore.EncodeWorkerUpsert(w)); !errors.Is(err, raftstore.ErrInvalidEntry) {
			t.Errorf("%s: ValidateEntry = %v, want ErrInvalidEntry", name, err)
		}
		if err := raftstore.CheckWorker(w); err == nil {
			t.Errorf("%s: CheckWorker = nil", name)
		}
	}
	if err := raftstore.ValidateEntry(raftstore.EncodeWorkerRemove("")); !errors.Is(err, raftstore.ErrInvalidEntry) {
		t.Errorf("removing the empty URL: ValidateEntry = %v, want ErrInvalidEntry", err)
	}
	for _, data := range [][]byte{raftstore.EncodeWorkerUpsert(workerRec(1, t0)), raftstore.EncodeWorkerRemove("http://a:1"),
		raftstore.EncodeWorkerExpire(t0)} {
		if err := raftstore.ValidateEntry(data); err != nil {
			t.Errorf("%v entry: ValidateEntry = %v", raftstore.EntryType(data[0]), err)
		}
		// Only the leader keeps the registry: no member forwards it.
		if err := raftstore.CheckForwarded(data, 1); !errors.Is(err, raftstore.ErrNotForwardable) {
			t.Errorf("%v entry forwarded by node 1: %v, want ErrNotForwardable", raftstore.EntryType(data[0]), err)
		}
	}
	// A truncated record does not decode.
	good := raftstore.EncodeWorkerUpsert(workerRec(1, t0))
	if err := raftstore.ValidateEntry(good[:len(good)-3]); !errors.Is(err, raftstore.ErrBadEntry) {
		t.Errorf("a truncated worker record: ValidateEntry = %v, want ErrBadEntry", err)
	}
}

func TestSnapshotKeepsTheWorkerRegistry(t *testing.T) {
	a := newApplier(t)
	a.ok(raftstore.EncodeMemberUpsert(member(1)))
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(1, t0.Add(time.Second))))
	a.ok(raftstore.EncodeWorkerUpsert(workerRec(2, t0.Add(time.Minute))))
	snap, _ := a.f.Snapshot()
	a.ok(raftstore.EncodeWorkerRemove(workerRec(1, t0).URL)) // after the snapshot: not in it
	b := persist(t, snap).Bytes()
	if b[8] != 2 {
		t.Fatalf("a snapshot with workers is of format %d, want 2", b[8])
	}
	f := raftstore.NewFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	got := f.Workers(time.Time{})
	if len(got) != 2 || got[0] != workerRec(1, t0.Add(time.Second)) || got[1] != workerRec(2, t0.Add(time.Minute)) {
		t.Fatalf("restored workers %+v, want both records as registered", got)
	}
	// Without workers, the format stays 1, which builds without a
	// registry read.
	a.ok(raftstore.EncodeWorkerRemove(workerRec(2, t0).URL))
	snap, _ = a.f.Snapshot()
	if b := persist(t, snap).Bytes(); b[8] != 1 {
		t.Fatalf("a snapshot without workers is of format %d, want 1", b[8])
	}
	// Restoring replaces the registry: a snapshot without workers empties it.
	if err := f.Restore(io.NopCloser(bytes.NewReader(persist(t, snap).Bytes()))); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if n := len(f.Workers(time.Time{})); n != 0 {
		t.Fatalf("restoring a snapshot without workers left %d", n)
	}
}

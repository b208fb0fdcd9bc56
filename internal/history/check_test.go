package history

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

var bounds = Bounds{Staleness: 2 * time.Second, Durable: 1500 * time.Millisecond, Liveness: 4 * time.Second}

// crafted is a history of three ready nodes, probed every 100ms for 30s
// from t0, with keys 1, 2 and 3 put on node 1 and acknowledged at t0+1s.
func crafted(t0 time.Time) *History {
	h := New()
	for d := time.Duration(0); d < 30*time.Second; d += 100 * time.Millisecond {
		for n := index.NodeID(1); n <= 3; n++ {
			h.AddReadiness(Readiness{Node: n, At: t0.Add(d), Ready: true})
		}
	}
	for k := range 3 {
		h.Add(Op{Kind: Put, Key: key(k + 1), Node: 1, Holder: 1, Start: t0.Add(500 * time.Millisecond),
			End: t0.Add(600 * time.Millisecond), Acked: t0.Add(time.Second), Result: Intact})
	}
	return h
}

func key(i int) index.Key { return index.Key{NS: 1, Hash: index.Hash(i)} }

// read is a read of key on node from t0+at, 100ms long.
func read(t0 time.Time, at time.Duration, node index.NodeID, k index.Key, listed bool, r Result) Op {
	return Op{Kind: Read, Key: k, Node: node, Start: t0.Add(at), End: t0.Add(at + 100*time.Millisecond),
		Deadline: t0.Add(at + 10*time.Second), Listed: listed, Result: r}
}

// settle adds the settled check's ops for key: every node lists it on
// node 1, which serves it.
func settle(h *History, t0 time.Time, k index.Key) {
	for n := index.NodeID(1); n <= 3; n++ {
		h.Add(Op{Kind: Read, Key: k, Node: n, Start: t0.Add(25 * time.Second), End: t0.Add(25 * time.Second), Listed: true, Result: Intact, Settled: true},
			Op{Kind: Fetch, Key: k, Node: 1, Via: n, Start: t0.Add(25 * time.Second), End: t0.Add(25 * time.Second), Result: Intact, Settled: true})
	}
}

func TestACleanHistoryPasses(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.Add(read(t0, 300*time.Millisecond, 2, key(1), false, Missing), // before its ack
		read(t0, 1500*time.Millisecond, 2, key(1), false, Missing), // within the bound
		read(t0, 5*time.Second, 2, key(1), true, Intact),
		read(t0, 5*time.Second, 3, key(2), true, Intact))
	for k := range 3 {
		settle(h, t0, key(k+1))
	}
	h.AddLiveness(Liveness{From: 2, At: t0.Add(5 * time.Second), Leader: 1})
	r := Check(h, bounds)
	if len(r.Corrupt)+len(r.Stale)+len(r.FailedInTime)+len(r.Lost)+len(r.HealthyDown)+r.Phantom > 0 {
		t.Fatalf("a clean history is flagged: %+v", r)
	}
	// Key 1 was missed before its ack and within the bound, then found:
	// its worst read counts.
	if got := r.Windows[0].Counts.String(); got != "2 keys, 1 intact / 0 stale / 1 missing / 0 corrupt (4 reads, 0 failed)" {
		t.Errorf("window: %s", got)
	}
	if got := r.Settled.String(); got != "3 keys, 3 intact / 0 stale / 0 missing / 0 corrupt (18 reads, 0 failed)" {
		t.Errorf("settled: %s", got)
	}
	if r.Puts != 3 || r.Acked != 3 {
		t.Errorf("%d puts, %d acknowledged; want 3, 3", r.Puts, r.Acked)
	}
}

func TestTheCheckerFlagsACorruptRead(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.Add(read(t0, 5*time.Second, 2, key(1), true, Corrupt))
	r := Check(h, bounds)
	if len(r.Corrupt) != 1 || r.Windows[0].Corrupt != 1 {
		t.Fatalf("a corrupt read is not flagged: %+v", r)
	}
}

func TestTheCheckerFlagsAStaleRead(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	// Node 2, ready, does not list key 1 four seconds after its ack.
	stale := read(t0, 5*time.Second, 2, key(1), false, Missing)
	// Node 3 does not either, but it said it was not ready.
	h.AddReadiness(Readiness{Node: 3, At: t0.Add(5050 * time.Millisecond), Ready: false})
	h.Add(stale, read(t0, 5*time.Second, 3, key(1), false, Missing))
	r := Check(h, bounds)
	if len(r.Stale) != 1 || r.Stale[0] != stale || r.Windows[0].Stale != 1 || r.Windows[0].Missing != 0 {
		t.Fatalf("stale reads: %+v; window %v; want node 2's alone", r.Stale, r.Windows[0].Counts)
	}
}

func TestAReadIsNotStaleWhileItsHolderHasAFault(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.AddFault(Fault{Name: "pause node 1", Kind: Pause, Node: 1, Start: t0.Add(3 * time.Second),
		End: t0.Add(7 * time.Second), Ready: t0.Add(7200 * time.Millisecond)})
	h.Add(read(t0, 5*time.Second, 2, key(1), false, Missing),
		read(t0, 8*time.Second, 2, key(1), false, Missing)) // within the bound of its end
	r := Check(h, bounds)
	if len(r.Stale) != 0 || len(r.Windows) != 2 || r.Windows[1].Missing != 1 {
		t.Fatalf("stale %+v, windows %+v", r.Stale, r.Windows)
	}
}

func TestAfterSettlingPhantomsAndLostKeysAreFlagged(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	// Node 1 is killed at t0+10s: key 2 was in its SSD long enough, key 3
	// only just, key 1 never.
	h.SeenOnSSD(1, key(2), t0.Add(2*time.Second))
	h.SeenOnSSD(1, key(3), t0.Add(9*time.Second))
	h.AddFault(Fault{Name: "kill -9 node 1", Kind: Kill, Node: 1, Start: t0.Add(10 * time.Second),
		End: t0.Add(11 * time.Second), Ready: t0.Add(12 * time.Second)})
	// After settling node 3 still lists key 1 on node 1, which has lost it;
	// nobody serves key 2 (lost) nor key 3 (allowed: in DRAM at the kill).
	h.Add(Op{Kind: Read, Key: key(1), Node: 3, Listed: true, Result: Missing, Settled: true},
		Op{Kind: Fetch, Key: key(1), Node: 1, Via: 3, Result: Missing, Settled: true},
		Op{Kind: Read, Key: key(2), Node: 3, Listed: false, Result: Missing, Settled: true},
		Op{Kind: Read, Key: key(3), Node: 3, Listed: false, Result: Missing, Settled: true})
	r := Check(h, bounds)
	if r.Phantom != 1 {
		t.Errorf("%d phantoms, want key 1's location", r.Phantom)
	}
	if !slices.Equal(r.Lost, []index.Key{key(2)}) {
		t.Errorf("lost %v, want key 2 alone", r.Lost)
	}
	if got := r.Settled.String(); got != "3 keys, 0 intact / 1 stale / 2 missing / 0 corrupt (4 reads, 0 failed)" {
		t.Errorf("settled: %s", got)
	}
}

func TestAHealthyNodeMarkedDownIsFlagged(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.AddFault(Fault{Name: "pause node 1", Kind: Pause, Node: 1, Start: t0.Add(3 * time.Second),
		End: t0.Add(7 * time.Second), Ready: t0.Add(7200 * time.Millisecond)})
	h.AddLiveness(Liveness{From: 2, At: t0.Add(6 * time.Second), Leader: 2, Down: []index.NodeID{1}}) // paused: right
	h.AddLiveness(Liveness{From: 1, At: t0.Add(8 * time.Second), Leader: 1, Down: []index.NodeID{2}}) // healthy: wrong
	h.AddLiveness(Liveness{From: 3, At: t0.Add(8 * time.Second), Leader: 1, Down: []index.NodeID{2}}) // the same episode
	r := Check(h, bounds)
	if len(r.HealthyDown) != 1 || !strings.Contains(r.HealthyDown[0], "node 2, with no fault of its own, shown down by node 1") {
		t.Fatalf("healthy nodes marked down: %q", r.HealthyDown)
	}
}

func TestAReplicaCatchingUpMayShowThePast(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	// Node 3 restarts: not ready while its replica replays the log, in
	// which node 2 was once down.
	h.AddFault(Fault{Name: "restart node 3", Kind: Kill, Node: 3, Start: t0.Add(3 * time.Second),
		End: t0.Add(4 * time.Second), Ready: t0.Add(9 * time.Second)})
	for d := 3 * time.Second; d < 9*time.Second; d += 100 * time.Millisecond {
		h.AddReadiness(Readiness{Node: 3, At: t0.Add(d + 50*time.Millisecond), Ready: false})
	}
	h.AddLiveness(Liveness{From: 3, At: t0.Add(7 * time.Second), Leader: 1, Down: []index.NodeID{2}})
	if r := Check(h, bounds); len(r.HealthyDown) != 0 {
		t.Fatalf("a replica that said it was not ready is flagged: %q", r.HealthyDown)
	}
	// The same sighting from a ready replica is flagged.
	h.AddLiveness(Liveness{From: 1, At: t0.Add(7 * time.Second), Leader: 1, Down: []index.NodeID{2}})
	if r := Check(h, bounds); len(r.HealthyDown) != 1 {
		t.Fatalf("healthy nodes marked down: %q, want node 1's sighting", r.HealthyDown)
	}
}

func TestACallThatFailedWhileItsNodeWasBackInTimeIsFlagged(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.AddReadiness(Readiness{Node: 3, At: t0.Add(2050 * time.Millisecond), Ready: false})
	failed := read(t0, 2*time.Second, 2, key(1), false, Failed)
	h.Add(failed, Op{Kind: Read, Key: key(1), Node: 3, Start: t0.Add(29 * time.Second), End: t0.Add(29950 * time.Millisecond),
		Deadline: t0.Add(40 * time.Second), Result: Failed}) // node 3 not probed ready after it
	r := Check(h, bounds)
	if len(r.FailedInTime) != 1 || r.FailedInTime[0] != failed {
		t.Fatalf("failed in time: %+v; want node 2's read alone", r.FailedInTime)
	}
}

func TestAFaultWindowSaysWhenEveryOtherNodeHadPutsAcknowledgedAgain(t *testing.T) {
	t0 := time.Now()
	h := crafted(t0)
	h.AddFault(Fault{Name: "kill -9 node 1", Kind: Kill, Node: 1, Start: t0.Add(2 * time.Second)})
	put := func(node index.NodeID, k int, acked time.Duration) {
		h.Add(Op{Kind: Put, Key: key(k), Node: node, Holder: node, Start: t0, End: t0, Acked: t0.Add(acked), Result: Intact})
	}
	put(2, 10, 2500*time.Millisecond)
	if w := Check(h, bounds).Windows[1]; w.AckedAgain != -1 {
		t.Fatalf("acknowledged again after %v with node 3 never acknowledged, want -1", w.AckedAgain)
	}
	put(3, 11, 5*time.Second)
	put(3, 12, 4*time.Second)
	put(1, 13, 2100*time.Millisecond) // the faulty node's own does not count
	if w := Check(h, bounds).Windows[1]; w.AckedAgain != 2*time.Second {
		t.Fatalf("acknowledged again after %v, want node 3's 2s", w.AckedAgain)
	}
}

func TestContentDependsOnTheKey(t *testing.T) {
	a, b := Content(key(1), 1000), Content(key(2), 1000)
	if len(a) != 1000 || bytes.Equal(a, b) || !bytes.Equal(a, Content(key(1), 1000)) {
		t.Fatal("content is not a function of the key alone")
	}
	if bytes.Equal(Content(index.Key{NS: 2, Hash: 1}, 64), Content(key(1), 64)) {
		t.Fatal("two namespaces share a hash's content")
	}
}

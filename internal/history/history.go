// Package history records what a fault test did to a cluster and saw of
// it, and checks the record afterwards: every put, every read with what the
// node answered, every fault with when it began and ended, and samples of
// each node's readiness and of what each replica says about liveness.
//
// Check classifies each read (intact, stale, missing, corrupt, failed) and
// each key, per fault window and after the cluster settled, and lists the
// breaches of what the project promises (see Check). The checker trusts
// nothing the nodes say about themselves beyond their readiness: the
// content of every block is derived from its key (Content), so any reader
// can tell wrong bytes.
//
// A History is safe for concurrent use; Check reads a finished one.
package history

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// Kind says what an operation was.
type Kind uint8

const (
	// Put stored a block on Op.Node; Op.Acked is when a Sync on that node
	// returned after it (zero: never acknowledged).
	Put Kind = iota + 1
	// Read looked the key up on Op.Node (Op.Listed) and fetched it through
	// that node's view of the cluster (Op.Result).
	Read
	// Fetch asked Op.Node directly for a block a lookup on Op.Via listed
	// there; the probes of the settled check.
	Fetch
)

// Result is what an operation got.
type Result uint8

const (
	Intact  Result = iota + 1 // the block, with the bytes derived from its key
	Missing                   // no block
	Corrupt                   // a block with other bytes
	Failed                    // the call returned an error
)

var resultNames = map[Result]string{Intact: "intact", Missing: "missing", Corrupt: "corrupt", Failed: "failed"}

func (r Result) String() string { return resultNames[r] }

// Op is one operation of a worker.
type Op struct {
	Kind   Kind
	Key    index.Key
	Node   index.NodeID // the node asked
	Via    index.NodeID // Fetch: the node whose lookup listed Node
	Holder index.NodeID // the node the key was put on
	Start  time.Time
	End    time.Time
	// Deadline is the call's: a call that failed although its node was
	// ready again before it had no reason to give up.
	Deadline time.Time
	Acked    time.Time // Put: when the put was acknowledged
	Listed   bool      // Read: the node's lookup lists the key somewhere
	Settled  bool      // part of the check after the cluster settled
	Result   Result
	Err      string
}

// FaultKind names a fault.
type FaultKind string

// The faults whose effects Check knows: Kill loses what the node held only
// in DRAM; the others lose nothing.
const (
	Kill      FaultKind = "kill"      // SIGKILL, then a restart on the same data
	Pause     FaultKind = "pause"     // SIGSTOP, then SIGCONT
	Partition FaultKind = "partition" // cut off from the other nodes, then healed
)

// Fault is one fault of the schedule, on one node.
type Fault struct {
	Name string // for the summary, e.g. "kill -9 the leader"
	Kind FaultKind
	Node index.NodeID
	// Start is when it was injected, End when it was undone (restarted,
	// resumed, healed) and Ready when the node reported ready again.
	Start, End, Ready time.Time
	WasLeader         bool
	// Elected is how long after Start the other nodes agreed on a new
	// leader (0: they kept theirs); Converged how long after Ready every
	// replica had applied what the leader had when the node was ready.
	Elected, Converged time.Duration
}

// Readiness is one probe of a node's readiness, taken at At.
type Readiness struct {
	Node  index.NodeID
	At    time.Time
	Ready bool
}

// Liveness is what one replica said of the cluster's liveness at At.
type Liveness struct {
	From   index.NodeID
	At     time.Time
	Leader index.NodeID
	Down   []index.NodeID
}

// History is the record of one run.
type History struct {
	mu        sync.Mutex
	ops       []Op
	faults    []Fault
	readiness []Readiness
	liveness  []Liveness
	onSSD     map[nodeKey][]time.Time // when a key was seen in a node's ssd tier
}

type nodeKey struct {
	node index.NodeID
	key  index.Key
}

// New returns an empty history.
func New() *History { return &History{onSSD: map[nodeKey][]time.Time{}} }

// Add records operations.
func (h *History) Add(ops ...Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, ops...)
}

// AddFault records a fault.
func (h *History) AddFault(f Fault) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, f)
}

// AddReadiness records a readiness probe.
func (h *History) AddReadiness(r Readiness) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.readiness = append(h.readiness, r)
}

// AddLiveness records a replica's view of liveness.
func (h *History) AddLiveness(l Liveness) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.liveness = append(h.liveness, l)
}

// SeenOnSSD records that, at at, the directory listed key in node's ssd
// tier.
func (h *History) SeenOnSSD(node index.NodeID, key index.Key, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	nk := nodeKey{node, key}
	h.onSSD[nk] = append(h.onSSD[nk], at)
}

// Ops returns a copy of the operations recorded so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// Content is the content of key's block, size bytes: a stream of
// splitmix64 seeded by the key, so that no two keys share their bytes.
func Content(key index.Key, size int) []byte {
	b := make([]byte, size+7)
	x := uint64(key.Hash) ^ uint64(key.NS)*0x9e3779b97f4a7c15
	for i := 0; i < size; i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(b[i:], z^z>>31)
	}
	return b[:size]
}

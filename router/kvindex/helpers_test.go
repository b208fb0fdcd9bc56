package kvindex

import (
	"crypto/sha256"
	"encoding/binary"
	"testing"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/engine/pool"
	"github.com/kvstrata/kvstrata/index"
)

func testNS(model string, blockTokens int) index.Namespace {
	return index.Namespace{Model: model, BlockTokens: blockTokens,
		Layout: index.KVLayout{Layers: 2, KVHeads: 2, HeadDim: 8, DType: "bf16"}}
}

func newIndex(t testing.TB, cfg *Config) *Index {
	t.Helper()
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func register(t testing.TB, x *Index, w WorkerID, ns index.Namespace) {
	t.Helper()
	if err := x.Register(w, ns); err != nil {
		t.Fatal(err)
	}
}

func apply(t testing.TB, x *Index, w WorkerID, evs ...kvevents.Event) {
	t.Helper()
	if err := x.Apply(w, &kvevents.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
}

// hashForm writes an engine's 64-bit block id the way one engine does.
type hashForm func(uint64) kvevents.Hash

var (
	intForm hashForm = kvevents.UintHash
	// sha256Form writes a 32-byte digest whose last 8 bytes are the id, as
	// a vLLM that hashes with sha256 publishes it.
	sha256Form hashForm = func(v uint64) kvevents.Hash {
		d := sha256.Sum256(binary.LittleEndian.AppendUint64(nil, v))
		binary.BigEndian.PutUint64(d[24:], v)
		return kvevents.BytesHash(d[:])
	}
)

// stored is a GPU BlockStored of blocks named ids (by form) holding tokens,
// after parent (nil: none).
func stored(form hashForm, parent *uint64, ids []uint64, tokens []uint32, bt int) *kvevents.BlockStored {
	gpuMedium := kvevents.MediumGPU
	e := &kvevents.BlockStored{BlockSize: int64(bt), Medium: &gpuMedium}
	for _, id := range ids {
		e.BlockHashes = append(e.BlockHashes, form(id))
	}
	if parent != nil {
		p := form(*parent)
		e.ParentBlockHash = &p
	}
	for _, t := range tokens {
		e.TokenIDs = append(e.TokenIDs, int64(t))
	}
	return e
}

func removed(form hashForm, ids ...uint64) *kvevents.BlockRemoved {
	e := &kvevents.BlockRemoved{}
	for _, id := range ids {
		e.BlockHashes = append(e.BlockHashes, form(id))
	}
	return e
}

// overlapOf returns worker w's overlap in ms (0 if not listed), failing
// if w is listed twice.
func overlapOf(t testing.TB, ms []Match, w WorkerID) int {
	t.Helper()
	n, seen := 0, false
	for _, m := range ms {
		if m.Worker == w {
			if seen {
				t.Fatalf("worker %d listed twice in %v", w, ms)
			}
			n, seen = m.Blocks, true
		}
	}
	return n
}

// poolWorker is a worker's real block pool whose events become batches
// as a PoolSink would write them, in the hash form given.
type poolWorker struct {
	ns   index.Namespace
	p    *pool.Pool
	form hashForm
	evs  []kvevents.Event
}

func newPoolWorker(t testing.TB, ns index.Namespace, blocks int, form hashForm) *poolWorker {
	t.Helper()
	pw := &poolWorker{ns: ns, form: form}
	p, err := pool.New(pool.Config{Blocks: blocks, BlockTokens: ns.BlockTokens, Listener: pw.event})
	if err != nil {
		t.Fatal(err)
	}
	pw.p = p
	return pw
}

func (pw *poolWorker) event(e pool.Event) {
	switch e.Kind {
	case pool.BlockStored:
		ids := make([]uint64, len(e.Hashes))
		for i, h := range e.Hashes {
			ids[i] = uint64(h)
		}
		var parent *uint64
		if e.HasParent {
			p := uint64(e.Parent)
			parent = &p
		}
		pw.evs = append(pw.evs, stored(pw.form, parent, ids, e.Tokens, e.BlockTokens))
	case pool.BlockRemoved:
		ids := make([]uint64, len(e.Hashes))
		for i, h := range e.Hashes {
			ids[i] = uint64(h)
		}
		pw.evs = append(pw.evs, removed(pw.form, ids...))
	case pool.AllBlocksCleared:
		pw.evs = append(pw.evs, &kvevents.AllBlocksCleared{})
	}
}

// serve runs a request of tokens through the pool as an engine step does
// (find its cached prefix, allocate the rest, cache the full blocks, free)
// and returns the step's batch; nil if the pool had no room.
func (pw *poolWorker) serve(t testing.TB, tokens []uint32) *kvevents.Batch {
	t.Helper()
	id := pw.ns.ID()
	hashes := pw.ns.Hashes(tokens)
	found := pw.p.Find(id, hashes, len(tokens))
	need := (len(tokens)+pw.ns.BlockTokens-1)/pw.ns.BlockTokens - len(found)
	fresh, err := pw.p.Allocate(need)
	if err != nil {
		if err := pw.p.Free(found); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	table := append(found, fresh...)
	if _, err := pw.p.Cache(id, table, tokens); err != nil {
		t.Fatal(err)
	}
	if err := pw.p.Free(table); err != nil {
		t.Fatal(err)
	}
	b := &kvevents.Batch{Events: pw.evs}
	pw.evs = nil
	return b
}

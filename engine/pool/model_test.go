package pool

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

// model is the pool written as plainly as possible: slices scanned from
// end to end, hashes recomputed from the tokens.
type model struct {
	bt     int
	ref    []int
	key    []index.Key
	hashed []bool
	free   []BlockID // least recently freed first
	cached map[index.Key]BlockID
	events []Event
}

func newModel(blocks, bt int) *model {
	m := &model{bt: bt, ref: make([]int, blocks), key: make([]index.Key, blocks),
		hashed: make([]bool, blocks), cached: map[index.Key]BlockID{}}
	for i := range blocks {
		m.free = append(m.free, BlockID(i))
	}
	return m
}

func (m *model) find(hs []index.Hash) []BlockID {
	var out []BlockID
	for _, h := range hs {
		id, ok := m.cached[index.Key{NS: ns, Hash: h}]
		if !ok {
			break
		}
		if m.ref[id] == 0 {
			m.free = slices.DeleteFunc(m.free, func(f BlockID) bool { return f == id })
		}
		m.ref[id]++
		out = append(out, id)
	}
	return out
}

func (m *model) allocate(n int) ([]BlockID, bool) {
	if n > len(m.free) {
		return nil, false
	}
	out := slices.Clone(m.free[:n])
	m.free = m.free[n:]
	for _, id := range out {
		if reg, ok := m.cached[m.key[id]]; m.hashed[id] && ok && reg == id {
			delete(m.cached, m.key[id])
			m.events = append(m.events, Event{Kind: BlockRemoved, NS: ns, Hashes: []index.Hash{m.key[id].Hash}})
		}
		m.hashed[id] = false
		m.ref[id] = 1
	}
	return out, true
}

func (m *model) cache(table []BlockID, tokens []uint32) {
	all := index.AppendHashes(nil, uint64(ns), tokens, m.bt)
	var run []int // indexes of the current run of new hashes
	flush := func() {
		if len(run) == 0 {
			return
		}
		e := Event{Kind: BlockStored, NS: ns, BlockTokens: m.bt,
			Tokens: slices.Clone(tokens[run[0]*m.bt : (run[len(run)-1]+1)*m.bt])}
		for _, i := range run {
			e.Hashes = append(e.Hashes, all[i])
		}
		if run[0] > 0 {
			e.Parent, e.HasParent = all[run[0]-1], true
		}
		m.events = append(m.events, e)
		run = nil
	}
	from := len(all)
	for ; from > 0; from-- {
		id := table[from-1]
		if _, ok := m.cached[m.key[id]]; m.hashed[id] && ok {
			break
		}
	}
	for i, h := range all[from:] {
		i += from
		id := table[i]
		k := index.Key{NS: ns, Hash: h}
		m.hashed[id], m.key[id] = true, k
		if _, dup := m.cached[k]; dup {
			flush()
			continue
		}
		m.cached[k] = id
		run = append(run, i)
	}
	flush()
}

func (m *model) release(table []BlockID) {
	for _, id := range table {
		m.ref[id]--
	}
	for _, id := range slices.Backward(table) {
		if m.ref[id] == 0 && !slices.Contains(m.free, id) {
			m.free = append(m.free, id)
		}
	}
}

func (m *model) reset() bool {
	if len(m.free) != len(m.ref) {
		return false
	}
	clear(m.cached)
	clear(m.hashed)
	m.events = append(m.events, Event{Kind: AllBlocksCleared})
	return true
}

type request struct {
	tokens []uint32
	table  []BlockID
}

// TestRandomAgainstModel drives a pool and the model through the same
// random admissions, decode steps, finishes and resets, and checks after
// each that both answer alike, send the same events, and that the pool's
// invariants hold.
func TestRandomAgainstModel(t *testing.T) {
	for seed := range uint64(8) {
		const blocks, bt = 24, 4
		rng := rand.New(rand.NewPCG(seed, 7))
		p, r := newPool(t, blocks, bt)
		m := newModel(blocks, bt)
		var running []*request
		// A few prompt stems so that requests share prefixes.
		stems := [][]uint32{seq(0, 12), seq(1000, 9), seq(2000, 16)}
		live := map[index.Hash]bool{} // what the events say is cached

		for op := range 3000 {
			switch k := rng.IntN(10); {
			case k < 4: // admit
				stem := stems[rng.IntN(len(stems))]
				tokens := append(slices.Clone(stem[:rng.IntN(len(stem)+1)]), seq(rng.IntN(3)*100+5000, rng.IntN(9))...)
				if len(tokens) == 0 {
					continue
				}
				hs := hashes(tokens, bt)
				if len(tokens)%bt == 0 {
					hs = hs[:len(hs)-1] // the last token is computed for its logits
				}
				found := p.Find(ns, hs, len(tokens))
				if want := m.find(hs); !slices.Equal(found, want) {
					t.Fatalf("seed %d op %d: Find = %v, model %v", seed, op, found, want)
				}
				need := (len(tokens)+bt-1)/bt - len(found)
				fresh, err := p.Allocate(need)
				want, ok := m.allocate(need)
				if (err == nil) != ok || !slices.Equal(fresh, want) {
					t.Fatalf("seed %d op %d: Allocate(%d) = %v, %v; model %v, %v", seed, op, need, fresh, err, want, ok)
				}
				if err != nil {
					if !errors.Is(err, ErrNoSpace) {
						t.Fatal(err)
					}
					mustFree(t, p, found)
					m.release(found)
					break
				}
				req := &request{tokens: tokens, table: append(found, fresh...)}
				mustCache(t, p, req)
				m.cache(req.table, req.tokens)
				running = append(running, req)
			case k < 7 && len(running) > 0: // a decode step
				req := running[rng.IntN(len(running))]
				req.tokens = append(req.tokens, uint32(rng.IntN(50)))
				if len(req.tokens) > len(req.table)*bt {
					fresh, err := p.Allocate(1)
					want, ok := m.allocate(1)
					if (err == nil) != ok || !slices.Equal(fresh, want) {
						t.Fatalf("seed %d op %d: Allocate(1) = %v, %v; model %v", seed, op, fresh, err, want)
					}
					if err != nil {
						req.tokens = req.tokens[:len(req.tokens)-1] // preempted step: retry later
						break
					}
					req.table = append(req.table, fresh...)
				}
				mustCache(t, p, req)
				m.cache(req.table, req.tokens)
			case k < 9 && len(running) > 0: // finish
				i := rng.IntN(len(running))
				mustFree(t, p, running[i].table)
				m.release(running[i].table)
				running = slices.Delete(running, i, i+1)
			case k == 9:
				err := p.Reset()
				if (err == nil) != m.reset() {
					t.Fatalf("seed %d op %d: Reset = %v, model disagrees", seed, op, err)
				}
			}

			got := r.take()
			if len(got) != 0 || len(m.events) != 0 {
				if !reflect.DeepEqual(got, m.events) {
					t.Fatalf("seed %d op %d: events\n%+v\nmodel\n%+v", seed, op, got, m.events)
				}
			}
			m.events = nil
			for _, e := range got {
				switch e.Kind {
				case BlockStored:
					if e.HasParent && !live[e.Parent] {
						t.Fatalf("seed %d op %d: %v stored under parent %v, which is not cached", seed, op, e.Hashes, e.Parent)
					}
					for _, h := range e.Hashes {
						if live[h] {
							t.Fatalf("seed %d op %d: %v stored twice", seed, op, h)
						}
						live[h] = true
					}
				case BlockRemoved:
					for _, h := range e.Hashes {
						if !live[h] {
							t.Fatalf("seed %d op %d: %v removed but not stored", seed, op, h)
						}
						delete(live, h)
					}
				case AllBlocksCleared:
					clear(live)
				}
			}
			checkInvariants(t, p, m, running, live)
			if t.Failed() {
				t.Fatalf("seed %d op %d", seed, op)
			}
		}
		s := p.Stats()
		t.Logf("seed %d: %d finds, %d of %d blocks hit, %d evictions", seed, s.Requests, s.HitBlocks, s.QueriedBlocks, s.Evictions)
	}
}

func mustFree(t *testing.T, p *Pool, table []BlockID) {
	t.Helper()
	if err := p.Free(table); err != nil {
		t.Fatal(err)
	}
}

func mustCache(t *testing.T, p *Pool, req *request) {
	t.Helper()
	if _, err := p.Cache(ns, req.table, req.tokens); err != nil {
		t.Fatal(err)
	}
}

func checkInvariants(t *testing.T, p *Pool, m *model, running []*request, live map[index.Hash]bool) {
	t.Helper()
	// Reference counts are the number of running tables holding a block,
	// and the free queue is exactly the blocks nobody holds.
	refs := make([]int32, len(p.blocks))
	for _, req := range running {
		for _, id := range req.table {
			refs[id]++
		}
	}
	free := 0
	for id := range p.blocks {
		b := &p.blocks[id]
		if b.ref != refs[id] || int(b.ref) != m.ref[id] {
			t.Errorf("block %d: ref %d, held by %d tables, model %d", id, b.ref, refs[id], m.ref[id])
		}
		if b.queued != (b.ref == 0) {
			t.Errorf("block %d: ref %d but queued %v", id, b.ref, b.queued)
		}
		if b.queued {
			free++
		}
	}
	// The free queue runs in the model's order both ways.
	var order []BlockID
	for id := p.head; id != none; id = p.blocks[id].next {
		order = append(order, BlockID(id))
	}
	var back []BlockID
	for id := p.tail; id != none; id = p.blocks[id].prev {
		back = append(back, BlockID(id))
	}
	slices.Reverse(back)
	if !slices.Equal(order, m.free) || !slices.Equal(back, order) || p.NumFree() != free || free != len(order) {
		t.Errorf("free queue %v (backwards %v, count %d), model %v", order, back, p.NumFree(), m.free)
	}
	// The cached map is what the events announced, each entry naming a
	// block hashed under it.
	if len(p.cached) != len(live) {
		t.Errorf("%d hashes cached, events announced %d", len(p.cached), len(live))
	}
	for k, id := range p.cached {
		if !live[k.Hash] || !p.blocks[id].hashed || p.blocks[id].key != k {
			t.Errorf("cached %v -> block %d (hashed %v, key %v), announced %v", k, id, p.blocks[id].hashed, p.blocks[id].key, live[k.Hash])
		}
	}
	if want := float64(len(p.blocks)-free) / float64(len(p.blocks)); p.Usage() != want {
		t.Errorf("usage %v, want %v", p.Usage(), want)
	}
}

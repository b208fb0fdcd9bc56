package kvindex

import (
	"testing"

	"github.com/kvstrata/kvstrata/engine/kvevents"
	"github.com/kvstrata/kvstrata/index"
)

// FuzzApply feeds random event sequences of three workers (stores after
// known, unknown and no parents, removals, clears, resets, removals of the
// worker) under a small cap, and checks after each that nothing panics,
// the cap holds, and no overlap exceeds what the worker was ever told it
// stored since it was last cleared.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	f.Add([]byte{0, 0, 0, 16, 32, 48, 64, 1, 2, 3, 80, 81, 96, 112})
	f.Fuzz(func(t *testing.T, data []byte) {
		const bt, limit = 2, 24
		ns := testNS("m", bt)
		x := newIndex(t, &Config{MaxEntries: limit})
		const nw = 3
		for w := range WorkerID(nw) {
			register(t, x, w, ns)
		}
		next := uint64(1)
		chainOf := map[uint64][]index.Hash{} // engine id → its chain, as computed by the model
		var ids []uint64
		var chains [][]index.Hash
		held := make([]map[index.Hash]bool, nw) // what each worker was told it stored since its last clear
		for w := range held {
			held[w] = map[index.Hash]bool{}
		}
		byte1 := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		for len(data) > 0 {
			op := byte1()
			w := WorkerID(op>>4) % nw
			switch op & 7 {
			case 0, 1, 2: // store 1–3 blocks
				n := int(op&3) + 1
				var parent *uint64
				var chain []index.Hash
				prev := ns.Seed()
				known := true
				if p := byte1(); p%4 != 0 && len(ids) > 0 {
					id := ids[int(p)%len(ids)]
					parent = &id
					chain = append([]index.Hash(nil), chainOf[id]...)
					prev = uint64(chain[len(chain)-1])
				} else if p%8 == 4 { // a parent nobody stored
					id := uint64(1 << 40)
					parent, known = &id, false
				}
				toks := make([]uint32, n*bt)
				for i := range toks {
					toks[i] = uint32(byte1() % 4)
				}
				blockIDs := make([]uint64, n)
				for i := range blockIDs {
					blockIDs[i] = next
					next++
					h := index.ChainHash(prev, toks[i*bt:(i+1)*bt])
					prev = uint64(h)
					chain = append(chain, h)
					if known {
						held[w][h] = true
						chainOf[blockIDs[i]] = append([]index.Hash(nil), chain...)
						ids = append(ids, blockIDs[i])
					}
				}
				if known {
					chains = append(chains, chain)
				}
				form := intForm
				if op&8 != 0 {
					form = sha256Form
				}
				_ = x.Apply(w, &kvevents.Batch{Events: []kvevents.Event{stored(form, parent, blockIDs, toks, bt)}})
			case 3, 4: // remove
				if len(ids) > 0 {
					form := intForm
					if op&8 != 0 {
						form = sha256Form
					}
					_ = x.Apply(w, &kvevents.Batch{Events: []kvevents.Event{removed(form, ids[int(byte1())%len(ids)])}})
				}
			case 5:
				_ = x.Apply(w, &kvevents.Batch{Events: []kvevents.Event{&kvevents.AllBlocksCleared{}}})
				held[w] = map[index.Hash]bool{}
			case 6:
				if err := x.ClearWorker(w); err != nil {
					t.Fatal(err)
				}
				held[w] = map[index.Hash]bool{}
			case 7:
				if err := x.RemoveWorker(w); err != nil {
					t.Fatal(err)
				}
				register(t, x, w, ns)
				held[w] = map[index.Hash]bool{}
			}
			if s := x.Stats(); s.Entries > limit {
				t.Fatalf("%d entries, cap %d", s.Entries, limit)
			}
			for _, c := range chains {
				for _, m := range x.Overlap(ns.ID(), c, nil) {
					if m.Blocks < 1 || m.Blocks > len(c) || int(m.Worker) >= nw {
						t.Fatalf("bad match %+v for a chain of %d", m, len(c))
					}
					for _, h := range c[:m.Blocks] {
						if !held[m.Worker][h] {
							t.Fatalf("worker %d matched %d blocks of a chain, but never stored block %v", m.Worker, m.Blocks, h)
						}
					}
				}
			}
		}
	})
}

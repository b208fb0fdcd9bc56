package pool

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/index"
)

const ns = index.NamespaceID(0x5eed)

// recorder collects a pool's events.
type recorder struct{ events []Event }

func (r *recorder) listen(e Event) { r.events = append(r.events, e) }

func (r *recorder) take() []Event {
	e := r.events
	r.events = nil
	return e
}

func newPool(t testing.TB, blocks, blockTokens int) (*Pool, *recorder) {
	t.Helper()
	r := &recorder{}
	p, err := New(Config{Blocks: blocks, BlockTokens: blockTokens, Listener: r.listen})
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

// seq returns n token ids starting at from.
func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func hashes(tokens []uint32, bt int) []index.Hash {
	return index.AppendHashes(nil, uint64(ns), tokens, bt)
}

// admit runs a request's admission as an engine does: the cached prefix,
// fresh blocks for the rest, then every full block cached. It returns the
// request's block table and how many blocks were found cached.
func admit(t testing.TB, p *Pool, tokens []uint32) ([]BlockID, int) {
	t.Helper()
	bt := p.BlockTokens()
	found := p.Find(ns, hashes(tokens, bt), len(tokens))
	fresh, err := p.Allocate((len(tokens)+bt-1)/bt - len(found))
	if err != nil {
		t.Fatalf("admit %d tokens: %v", len(tokens), err)
	}
	table := append(found, fresh...)
	if _, err := p.Cache(ns, table, tokens); err != nil {
		t.Fatal(err)
	}
	return table, len(found)
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("a pool of no blocks was made")
	}
	err := (&Config{Blocks: -1, BlockTokens: -2}).Validate()
	if err == nil || !strings.Contains(err.Error(), "Blocks") || !strings.Contains(err.Error(), "BlockTokens") {
		t.Errorf("Validate names both bad fields: %v", err)
	}
	p, err := New(Config{Blocks: 3})
	if err != nil {
		t.Fatal(err)
	}
	if p.BlockTokens() != 16 || p.NumFree() != 3 {
		t.Errorf("defaults: %d tokens a block, %d free; want 16, 3", p.BlockTokens(), p.NumFree())
	}
}

func TestPrefixHitAfterRequestFinishes(t *testing.T) {
	p, _ := newPool(t, 8, 4)
	prompt := seq(100, 10) // two full blocks and a partial one
	table, hit := admit(t, p, prompt)
	if hit != 0 {
		t.Fatalf("an empty pool found %d blocks", hit)
	}
	if err := p.Free(table); err != nil {
		t.Fatal(err)
	}
	// A second request sharing the first 8 tokens, then diverging.
	next := append(seq(100, 8), seq(900, 5)...)
	got := p.Find(ns, hashes(next, 4), len(next))
	if !slices.Equal(got, table[:2]) {
		t.Errorf("after the first request finished, Find = %v, want its two full blocks %v", got, table[:2])
	}
	if p.NumFree() != 6 {
		t.Errorf("found blocks leave the free queue: %d free, want 6", p.NumFree())
	}
}

func TestEvictionIsLRU(t *testing.T) {
	p, r := newPool(t, 3, 2)
	var tables [][]BlockID
	for i := range 3 { // three one-block requests fill the pool
		table, _ := admit(t, p, seq(10*i, 2))
		tables = append(tables, table)
	}
	// Finish them in the order 1, 0, 2: block of request 1 is the least
	// recently freed.
	for _, i := range []int{1, 0, 2} {
		if err := p.Free(tables[i]); err != nil {
			t.Fatal(err)
		}
	}
	r.take()
	for _, want := range []int{1, 0, 2} {
		got, err := p.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		if got[0] != tables[want][0] {
			t.Fatalf("Allocate reused block %d, want %d (request %d's, least recently freed)", got[0], tables[want][0], want)
		}
		ev := r.take()
		wantEv := []Event{{Kind: BlockRemoved, NS: ns, Hashes: hashes(seq(10*want, 2), 2)}}
		if !reflect.DeepEqual(ev, wantEv) {
			t.Fatalf("evicting request %d's block: events %+v, want %+v", want, ev, wantEv)
		}
		if n := p.Match(ns, hashes(seq(10*want, 2), 2)); n != 0 {
			t.Fatalf("request %d's evicted hash still matches", want)
		}
	}
}

func TestTouchedBlockMovesToMostRecent(t *testing.T) {
	p, _ := newPool(t, 2, 2)
	a, _ := admit(t, p, seq(0, 2))
	b, _ := admit(t, p, seq(50, 2))
	_ = p.Free(a)
	_ = p.Free(b)
	// A request reuses a's block, then finishes: a is now the most
	// recently freed, so b's block goes first.
	again, hit := admit(t, p, seq(0, 3))
	if hit != 1 {
		t.Fatalf("hit %d blocks, want 1", hit)
	}
	// The partial third token needed a block: b's, the least recently freed.
	if again[1] != b[0] {
		t.Fatalf("partial block got %d, want b's %d", again[1], b[0])
	}
	if p.Match(ns, hashes(seq(0, 2), 2)) != 1 {
		t.Error("the block in use lost its hash")
	}
}

func TestBlockInUseIsNeverEvicted(t *testing.T) {
	p, r := newPool(t, 4, 2)
	held, _ := admit(t, p, seq(0, 4)) // two blocks, kept
	done, _ := admit(t, p, seq(100, 4))
	_ = p.Free(done)
	r.take()
	if _, err := p.Allocate(3); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Allocate(3) with 2 free: %v, want ErrNoSpace", err)
	}
	got, err := p.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(got, func(id BlockID) bool { return slices.Contains(held, id) }) {
		t.Fatalf("Allocate gave %v, which includes blocks in use %v", got, held)
	}
	if p.Match(ns, hashes(seq(0, 4), 2)) != 2 {
		t.Error("blocks in use lost their hashes")
	}
	for _, e := range r.take() {
		for _, h := range e.Hashes {
			if slices.Contains(hashes(seq(0, 4), 2), h) {
				t.Errorf("event %v removed a block in use", e)
			}
		}
	}
}

func TestSharedPrefixRefCounts(t *testing.T) {
	p, _ := newPool(t, 6, 2)
	prefix := seq(0, 4)
	a, _ := admit(t, p, append(slices.Clone(prefix), 7, 7))
	b, hit := admit(t, p, append(slices.Clone(prefix), 9, 9))
	if hit != 2 || !slices.Equal(a[:2], b[:2]) {
		t.Fatalf("b shares %d blocks (%v vs %v), want the 2 of the prefix", hit, a, b)
	}
	if p.NumFree() != 2 {
		t.Fatalf("%d free, want 2 (6 - 2 shared - 1 each)", p.NumFree())
	}
	_ = p.Free(a)
	// a's own block is free, the shared ones are still held by b.
	if p.NumFree() != 3 {
		t.Fatalf("after a finished: %d free, want 3", p.NumFree())
	}
	got, err := p.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range got {
		if slices.Contains(b, id) {
			t.Fatalf("Allocate took block %d that b still holds", id)
		}
	}
	if p.Match(ns, hashes(prefix, 2)) != 2 {
		t.Error("the shared prefix was evicted while b holds it")
	}
	_ = p.Free(got)
	_ = p.Free(b)
	if p.NumFree() != 6 {
		t.Errorf("everything freed: %d free, want 6", p.NumFree())
	}
}

func TestAllocateFailureChangesNothing(t *testing.T) {
	p, r := newPool(t, 3, 2)
	held, _ := admit(t, p, seq(0, 4))
	cached, _ := admit(t, p, seq(10, 2))
	_ = p.Free(cached)
	r.take()
	before := p.Stats()
	_, err := p.Allocate(2)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "want 2, 1 of 3 free") {
		t.Fatalf("Allocate(2) with 1 free: %v", err)
	}
	if ev := r.take(); ev != nil {
		t.Errorf("a failed Allocate sent events %v", ev)
	}
	if after := p.Stats(); after != before {
		t.Errorf("a failed Allocate changed the stats: %+v, then %+v", before, after)
	}
	if p.Match(ns, hashes(seq(10, 2), 2)) != 1 {
		t.Error("a failed Allocate evicted a cached block")
	}
	// Every block in use: none to give.
	one, _ := p.Allocate(1)
	if _, err := p.Allocate(1); !errors.Is(err, ErrNoSpace) {
		t.Errorf("Allocate with every block in use: %v, want ErrNoSpace", err)
	}
	_ = p.Free(append(held, one...))
}

func TestFreeBadInputChangesNothing(t *testing.T) {
	p, _ := newPool(t, 3, 2)
	a, _ := admit(t, p, seq(0, 2))
	before := p.Stats()
	for _, bad := range [][]BlockID{{a[0], 2}, {a[0], a[0]}, {a[0], 7}, {-1}} {
		if err := p.Free(bad); !errors.Is(err, ErrBadBlock) {
			t.Errorf("Free(%v): %v, want ErrBadBlock", bad, err)
		}
		if after := p.Stats(); after != before {
			t.Errorf("Free(%v) changed the pool: %+v, then %+v", bad, before, after)
		}
	}
	if _, err := p.Cache(ns, []BlockID{2}, seq(0, 2)); !errors.Is(err, ErrBadBlock) {
		t.Errorf("Cache of a free block: %v, want ErrBadBlock", err)
	}
	if _, err := p.Cache(ns, a, seq(0, 4)); !errors.Is(err, ErrBadBlock) {
		t.Errorf("Cache of more tokens than blocks hold: %v, want ErrBadBlock", err)
	}
	if err := p.Free(a); err != nil {
		t.Fatal(err)
	}
}

func TestEventsInOrderWithParents(t *testing.T) {
	p, r := newPool(t, 4, 2)
	tokens := seq(0, 5)
	h := hashes(tokens, 2)
	found := p.Find(ns, h, len(tokens))
	table, err := p.Allocate(3)
	if len(found) != 0 || err != nil {
		t.Fatal(found, err)
	}
	// Prefill stored two blocks in one event, the first without a parent.
	if _, err := p.Cache(ns, table, tokens[:4]); err != nil {
		t.Fatal(err)
	}
	// Decode fills the third block: its parent is the second.
	tokens = append(tokens, 42)
	got, err := p.Cache(ns, table, tokens)
	if err != nil || !slices.Equal(got, hashes(tokens, 2)[2:]) {
		t.Fatalf("Cache = %v, %v; want the third block's hash", got, err)
	}
	if got, _ := p.Cache(ns, table, tokens); got != nil {
		t.Errorf("Cache with no newly full block named %v", got)
	}
	_ = p.Free(table)
	if err := p.Reset(); err != nil {
		t.Fatal(err)
	}
	all := hashes(tokens, 2)
	want := []Event{
		{Kind: BlockStored, NS: ns, Hashes: all[:2], Tokens: seq(0, 4), BlockTokens: 2},
		{Kind: BlockStored, NS: ns, Hashes: all[2:], Parent: all[1], HasParent: true, Tokens: []uint32{4, 42}, BlockTokens: 2},
		{Kind: AllBlocksCleared},
	}
	if ev := r.take(); !reflect.DeepEqual(ev, want) {
		t.Errorf("events\n%+v\nwant\n%+v", ev, want)
	}
	if p.Match(ns, all) != 0 || p.Stats().Cached != 0 {
		t.Error("Reset left hashes findable")
	}
}

func TestDuplicateHashIsStoredOnce(t *testing.T) {
	p, r := newPool(t, 4, 2)
	a, _ := p.Allocate(2)
	b, _ := p.Allocate(2)
	// Both compute the same prompt before either is cached.
	_, _ = p.Cache(ns, a, seq(0, 4))
	_, _ = p.Cache(ns, b, seq(0, 4))
	if ev := r.take(); len(ev) != 1 {
		t.Fatalf("the same two hashes cached twice sent %d events, want 1: %v", len(ev), ev)
	}
	if got := p.Find(ns, hashes(seq(0, 4), 2), 4); !slices.Equal(got, a) {
		t.Fatalf("Find = %v, want a's blocks %v", got, a)
	}
	_ = p.Free(a) // Find's references
	_ = p.Free(b)
	_ = p.Free(a)
	// Reusing every block removes each hash once.
	if _, err := p.Allocate(4); err != nil {
		t.Fatal(err)
	}
	if ev := r.take(); len(ev) != 2 {
		t.Errorf("evicting two hashes held by four blocks sent %d events, want 2: %v", len(ev), ev)
	}
}

func TestResetWhileInUse(t *testing.T) {
	p, r := newPool(t, 2, 2)
	a, _ := admit(t, p, seq(0, 2))
	r.take()
	if err := p.Reset(); !errors.Is(err, ErrInUse) {
		t.Fatalf("Reset with a block held: %v, want ErrInUse", err)
	}
	if r.take() != nil || p.Match(ns, hashes(seq(0, 2), 2)) != 1 {
		t.Error("a failed Reset changed the cache")
	}
	_ = p.Free(a)
}

func TestUsageAndCounters(t *testing.T) {
	p, _ := newPool(t, 10, 4)
	if p.Usage() != 0 {
		t.Errorf("empty pool usage %v", p.Usage())
	}
	a, _ := admit(t, p, seq(0, 10)) // 3 blocks, 2 full; 10 tokens queried, none hit
	if p.Usage() != 0.3 {
		t.Errorf("usage %v, want 0.3", p.Usage())
	}
	_ = p.Free(a)
	if p.Usage() != 0 {
		t.Errorf("usage after freeing %v, want 0 (cached free blocks are free)", p.Usage())
	}
	b, _ := admit(t, p, seq(0, 9)) // 9 tokens queried, 8 (2 blocks) hit
	s := p.Stats()
	want := Stats{Blocks: 10, Free: 7, Cached: 2, Usage: s.Usage, Requests: 2,
		QueriedTokens: 19, HitTokens: 8, QueriedBlocks: 4, HitBlocks: 2}
	if s != want {
		t.Errorf("stats %+v\nwant  %+v", s, want)
	}
	_ = p.Free(b)
}

func TestCopyIsStoredWhenItsOriginalIsEvicted(t *testing.T) {
	p, r := newPool(t, 6, 2)
	a, _ := p.Allocate(1)
	b, _ := p.Allocate(1)
	// Both compute the same first block; only a's is findable.
	_, _ = p.Cache(ns, a, seq(0, 2))
	_, _ = p.Cache(ns, b, seq(0, 2))
	_ = p.Free(a)
	// Reuse the free blocks up to a's: its hash is evicted though b still
	// holds a copy.
	others, err := p.Allocate(5)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Free(others[:1]) // room for b's next block
	h := hashes(append(seq(0, 2), 7, 8), 2)
	if p.Match(ns, h) != 0 {
		t.Fatal("the evicted hash is still findable")
	}
	r.take()
	// b's next block fills. Its parent must be cached for its event to
	// make sense, so b's copy is stored with it.
	more, err := p.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, more...)
	got, err := p.Cache(ns, b, append(seq(0, 2), 7, 8))
	if err != nil || !slices.Equal(got, h) {
		t.Fatalf("Cache = %v, %v; want both hashes %v", got, err, h)
	}
	want := []Event{{Kind: BlockStored, NS: ns, Hashes: h, Tokens: append(seq(0, 2), 7, 8), BlockTokens: 2}}
	if ev := r.take(); !reflect.DeepEqual(ev, want) {
		t.Errorf("events %+v, want %+v", ev, want)
	}
	if p.Match(ns, h) != 2 {
		t.Error("b's blocks are not findable")
	}
}

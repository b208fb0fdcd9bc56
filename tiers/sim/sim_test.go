package sim

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/trace"
)

// blockTokens is the block size of the small traces below; req builds
// requests of whole blocks unless told otherwise.
const blockTokens = 4

func req(ids ...uint64) trace.Request {
	return trace.Request{InputLength: int64(len(ids) * blockTokens), HashIDs: ids}
}

func replayOne(t *testing.T, reqs []trace.Request, s SingleTier) Result {
	t.Helper()
	w, err := NewWorkload(reqs, blockTokens)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Replay(context.Background(), w, s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func wantHits(t *testing.T, r Result, blocks, tokens int64) {
	t.Helper()
	if r.HitBlocks != blocks || r.HitTokens != tokens {
		t.Fatalf("%v: %d hit blocks, %d hit tokens; want %d and %d", r.Spec, r.HitBlocks, r.HitTokens, blocks, tokens)
	}
}

func TestAHitIsTheLeadingBlocksUpToTheFirstMiss(t *testing.T) {
	r := replayOne(t, []trace.Request{
		req(1, 2, 3),
		req(1, 9, 3), // 3 is held but follows a miss
	}, SingleTier{"lru", 100})
	wantHits(t, r, 1, blockTokens)
	if r.Blocks != 6 || r.InputTokens != 6*blockTokens || r.Requests != 2 {
		t.Fatalf("totals: %d blocks, %d tokens, %d requests; want 6, %d, 2", r.Blocks, r.InputTokens, r.Requests, 6*blockTokens)
	}
	if got, want := r.BlockHitRate(), 1.0/6; got != want {
		t.Fatalf("block hit rate = %v, want %v", got, want)
	}
}

func TestTokenHitsStopAtTheInputLength(t *testing.T) {
	// Two blocks of a 4-token block size cover 5..8 tokens; a 6-token prompt
	// hits 6 tokens, not 8.
	partial := trace.Request{InputLength: 6, HashIDs: []uint64{1, 2}}
	r := replayOne(t, []trace.Request{partial, partial}, SingleTier{"lru", 100})
	wantHits(t, r, 2, 6)
	if got, want := r.TokenHitRate(), 6.0/12; got != want {
		t.Fatalf("token hit rate = %v, want %v", got, want)
	}
}

func TestCapacityIsWholeBlocks(t *testing.T) {
	// 11 tokens hold two 4-token blocks: the third evicts the first.
	r := replayOne(t, []trace.Request{req(1), req(2), req(3), req(1)}, SingleTier{"lru", 11})
	if r.CapacityBlocks != 2 {
		t.Fatalf("capacity = %d blocks, want 2", r.CapacityBlocks)
	}
	wantHits(t, r, 0, 0)
	if r.Evicted != 2 || r.Inserted != 4 {
		t.Fatalf("%d inserted, %d evicted; want 4 and 2", r.Inserted, r.Evicted)
	}
}

func TestEveryBlockOfARequestIsTouched(t *testing.T) {
	// Request 3 touches 1, so 2 is the least recently used when 3 arrives.
	r := replayOne(t, []trace.Request{req(1), req(2), req(1), req(3), req(1)}, SingleTier{"lru", 2 * blockTokens})
	wantHits(t, r, 2, 2*blockTokens)
}

func TestARequestNeverEvictsItsOwnBlocks(t *testing.T) {
	// Two blocks of room for a three-block request: the third is not stored
	// rather than pushing out the first, so the request hits in full up to
	// the capacity when it comes back.
	r := replayOne(t, []trace.Request{req(1, 2, 3), req(1, 2, 3)}, SingleTier{"lru", 2 * blockTokens})
	wantHits(t, r, 2, 2*blockTokens)
	if r.Rejected != 2 || r.Evicted != 0 {
		t.Fatalf("%d rejected, %d evicted; want 2 and 0", r.Rejected, r.Evicted)
	}
}

func TestBlocksLaterInTheRequestAreProtectedToo(t *testing.T) {
	// 1 and 3 are held; request 2 needs room for 2 while it still has to
	// read 3. Evicting 3 (the least recent after 1 is touched) would break
	// the request; 2 is not stored instead.
	r := replayOne(t, []trace.Request{req(1, 3), req(1, 2, 3), req(1, 3)}, SingleTier{"lru", 2 * blockTokens})
	if r.Rejected != 1 || r.Evicted != 0 {
		t.Fatalf("%d rejected, %d evicted; want 1 and 0", r.Rejected, r.Evicted)
	}
	wantHits(t, r, 1+2, 3*blockTokens)
}

func TestChainsReachThePolicyAsParents(t *testing.T) {
	// A three-block chain fills the cache; a one-block request then needs
	// room. LRU evicts the chain's root and strands the rest; prefix
	// evicts its leaf and the chain's first two blocks still hit.
	reqs := []trace.Request{req(1, 2, 3), req(4), req(1, 2)}
	lru := replayOne(t, reqs, SingleTier{"lru", 3 * blockTokens})
	wantHits(t, lru, 0, 0)
	prefix := replayOne(t, reqs, SingleTier{"prefix", 3 * blockTokens})
	wantHits(t, prefix, 2, 2*blockTokens)
}

func TestBeladyKeepsTheBlockUsedSoonest(t *testing.T) {
	// When 3 arrives, 2 is never used again and 1 is: Belady evicts 2,
	// LRU evicts 1.
	reqs := []trace.Request{req(1), req(2), req(3), req(1)}
	wantHits(t, replayOne(t, reqs, SingleTier{"lru", 2 * blockTokens}), 0, 0)
	wantHits(t, replayOne(t, reqs, SingleTier{"belady", 2 * blockTokens}), 1, blockTokens)
}

func TestRepeatedBlocksWithinARequest(t *testing.T) {
	// Traces are opaque: nothing stops an id from repeating in one request.
	r := replayOne(t, []trace.Request{req(1, 1, 2), req(1, 1, 2)}, SingleTier{"belady", 2 * blockTokens})
	wantHits(t, r, 3, 3*blockTokens)
	if r.Inserted != 2 {
		t.Fatalf("%d inserted, want 2", r.Inserted)
	}
}

func TestRunGivesTheResultsOfSeparateReplaysInSpecOrder(t *testing.T) {
	var reqs []trace.Request
	for i := range uint64(400) {
		reqs = append(reqs, req(0, i%7+1, i%13+10, i%29+30, i))
	}
	w, err := NewWorkload(reqs, blockTokens)
	if err != nil {
		t.Fatal(err)
	}
	var specs []Spec
	for _, p := range Policies {
		for _, c := range []int64{4 * blockTokens, 16 * blockTokens, 64 * blockTokens} {
			specs = append(specs, SingleTier{p, c})
		}
	}
	var calls, last, total int64
	rs, err := Run(context.Background(), w, specs, &Options{Parallel: 3, Progress: func(done, tot int64) {
		calls++
		if done < last {
			t.Errorf("progress went back from %d to %d", last, done)
		}
		last, total = done, tot
	}})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(specs)) * w.Blocks(); total != want || last != total || calls < int64(len(specs)) {
		t.Fatalf("progress ended at %d of %d after %d calls; want %d of %d", last, total, calls, want, want)
	}
	for i, s := range specs {
		one, err := Replay(context.Background(), w, s)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(rs[i], one) {
			t.Fatalf("Run result %d = %+v, a separate replay gives %+v", i, rs[i], one)
		}
	}
}

func TestRunReportsEveryBadSpec(t *testing.T) {
	w, err := NewWorkload([]trace.Request{req(1)}, 512)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), w, []Spec{
		SingleTier{"lru", 1e6},
		SingleTier{"mru", 1e6},
		SingleTier{"lfu", 0},
		SingleTier{"prefix", 100},
	}, nil)
	if err == nil {
		t.Fatal("Run accepted bad specs")
	}
	for _, want := range []string{
		`mru@1000000: unknown policy "mru" (want one of lru, lfu, prefix, s3fifo, wtinylfu, s3fifo-prefix, wtinylfu-prefix, arc, arc-prefix, lhd, belady)`,
		"lfu@0: capacity is 0 tokens, must be > 0",
		"prefix@100: capacity of 100 tokens holds no block of 512 tokens",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := NewWorkload(nil, 0); err == nil {
		t.Error("NewWorkload accepted 0-token blocks")
	}
}

func TestRunStopsWhenTheContextIsDone(t *testing.T) {
	var reqs []trace.Request
	for i := range uint64(5000) {
		reqs = append(reqs, req(i, i+1))
	}
	w, _ := NewWorkload(reqs, blockTokens)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Run(ctx, w, []Spec{SingleTier{"lru", 100}, SingleTier{"lfu", 100}}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a cancelled context = %v, want context.Canceled", err)
	}
}

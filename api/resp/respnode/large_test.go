package respnode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/api/resp"
	"github.com/kvstrata/kvstrata/api/resp/respnode"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

const block = 64 << 10 // the block limit of newStore's node

func randomValue(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, n64(n)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func n64(n int) uint64 { return uint64(n) }

func get(t *testing.T, s *respnode.Store, key string) ([]byte, error) {
	t.Helper()
	v, release, err := s.View(context.Background(), key)
	if err != nil {
		return nil, err
	}
	out := bytes.Clone(v)
	release()
	return out, nil
}

func mustGet(t *testing.T, s *respnode.Store, key string, want []byte) {
	t.Helper()
	got, err := get(t, s, key)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("GET %s: %d bytes, %v; want the %d bytes stored", key, len(got), err, len(want))
	}
}

func mustMiss(t *testing.T, s *respnode.Store, key string) {
	t.Helper()
	if got, err := get(t, s, key); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("GET %s: %d bytes, %v; want a miss", key, len(got), err)
	}
}

// blocksIn counts the blocks of namespace ns the node holds.
func blocksIn(n *node.Node, ns index.NamespaceID) int {
	return len(n.Hierarchy().Blocks(func(b tiers.BlockInfo) bool { return b.Key.NS == ns }))
}

func newNodeStore(t *testing.T, opts nodetest.Options) (*node.Node, *respnode.Store) {
	n := nodetest.Start(t, opts)
	return n.Node, respnode.New(n.Node)
}

// Values over one block are kept as several, read back byte for byte;
// only the record counts as a key; replacing or deleting a value removes
// its chunks.
func TestRESPLargeValuesAreChunked(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, DRAMBytes: 4 << 20, Inline: true})
	ctx := context.Background()
	for i, size := range []int{0, 1, block - 22, block - 21, block, 3*block + 5, 20 * block} {
		key := fmt.Sprintf("v%d", i)
		v := randomValue(size, 1)
		if err := s.Set(ctx, key, v); err != nil {
			t.Fatalf("SET %d bytes: %v", size, err)
		}
		mustGet(t, s, key, v)
		if info, err := s.Stat(ctx, key); err != nil || info.Size != int64(size) || info.Footprint < int64(size) {
			t.Fatalf("STAT of %d bytes: %+v %v", size, info, err)
		}
	}
	if l, _ := s.Len(ctx); l != 7 {
		t.Fatalf("Len %d, want 7: chunks must not count as keys", l)
	}
	// A key of 2 bytes leaves block-22 bytes for an inline value; chunks
	// are whole blocks.
	if c := blocksIn(n, respnode.ChunkNamespace); c != 1+1+4+20 {
		t.Fatalf("%d chunks held, want %d", c, 1+1+4+20)
	}
	// Replacing a chunked value by a small one, and deleting it, drop its chunks.
	if err := s.Set(ctx, "v6", []byte("small")); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "v6", []byte("small"))
	if ok, err := s.Delete(ctx, "v5"); !ok || err != nil {
		t.Fatalf("DEL: %v %v", ok, err)
	}
	if ok, err := s.Delete(ctx, "v5"); ok || err != nil {
		t.Fatalf("second DEL: %v %v", ok, err)
	}
	if c := blocksIn(n, respnode.ChunkNamespace); c != 2 {
		t.Fatalf("%d chunks held after replacing and deleting two chunked values, want 2 (of v3 and v4)", c)
	}
	// A chunked value replaced by another: the new one reads back, the
	// old chunks are gone.
	w := randomValue(5*block, 2)
	if err := s.Set(ctx, "v4", w); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "v4", w)
	if c := blocksIn(n, respnode.ChunkNamespace); c != 6 {
		t.Fatalf("%d chunks held, want v3's and the 5 of v4's new value", c)
	}
	if n, err := s.Flush(ctx); n != 6 || err != nil {
		t.Fatalf("FLUSH: %d %v, want 6 keys", n, err)
	}
	if c := blocksIn(n, respnode.ChunkNamespace) + blocksIn(n, index.RESPNamespace); c != 0 {
		t.Fatalf("%d blocks left after FLUSH", c)
	}
}

// A chunk that eviction took makes its value a miss, never short bytes,
// and the record and its other chunks are deleted when the miss is met.
func TestRESPMissingChunkReadsAsAMiss(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	v := randomValue(4*block, 3)
	if err := s.Set(ctx, "big", v); err != nil {
		t.Fatal(err)
	}
	chunks := n.Hierarchy().Blocks(func(b tiers.BlockInfo) bool { return b.Key.NS == respnode.ChunkNamespace })
	if err := n.Hierarchy().Delete(chunks[2].Key); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Exists(ctx, "big"); !ok {
		t.Fatal("EXISTS reads the record only: want true before a GET met the loss")
	}
	mustMiss(t, s, "big")
	if c := blocksIn(n, respnode.ChunkNamespace) + blocksIn(n, index.RESPNamespace); c != 0 {
		t.Fatalf("%d blocks left of a value that lost a chunk", c)
	}
}

// A large value moved to a lower tier reads back whole.
func TestRESPChunksReadBackAfterDemotion(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, DRAMBytes: 1 << 20, SSDBytes: 8 << 20, Inline: true})
	ctx := context.Background()
	vs := map[string][]byte{}
	for i := range 4 {
		key := fmt.Sprintf("chunked:%d", i)
		vs[key] = randomValue(20*block+i, uint64(i))
		if err := s.Set(ctx, key, vs[key]); err != nil {
			t.Fatal(err)
		}
	}
	if hs := n.Hierarchy().Stats(); hs.Levels[0].Demotions+hs.Levels[1].Demotions == 0 && hs.Levels[0].Evictions == 0 {
		t.Fatalf("5 MiB written into 1 MiB of DRAM and nothing demoted: %+v", hs.Levels)
	}
	for key, v := range vs {
		mustGet(t, s, key, v)
	}
}

// Expiry: a key past its deadline reads as missing everywhere and is
// deleted when met; deadlines survive in the record (KeepTTL, EXPIRE,
// PERSIST); a deadline not after now deletes.
func TestRESPExpiry(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	respnode.SetClock(s, func() time.Time { return now })
	at := now.Add(time.Hour)
	big := randomValue(3*block, 4)
	for key, v := range map[string][]byte{"small": []byte("v"), "big": big} {
		if ok, err := s.SetWith(ctx, key, v, resp.SetOptions{ExpireAt: at}); !ok || err != nil {
			t.Fatalf("SET %s EX: %v %v", key, ok, err)
		}
		if info, err := s.Stat(ctx, key); err != nil || !info.ExpireAt.Equal(at) {
			t.Fatalf("STAT %s: %+v %v, want deadline %v", key, info, err, at)
		}
		// KEEPTTL keeps it; a plain SET drops it.
		if _, err := s.SetWith(ctx, key, v, resp.SetOptions{KeepTTL: true}); err != nil {
			t.Fatal(err)
		}
		if info, _ := s.Stat(ctx, key); !info.ExpireAt.Equal(at) {
			t.Fatalf("after SET KEEPTTL: deadline %v, want %v", info.ExpireAt, at)
		}
	}
	if keys := scanAll(t, s); !slices.Equal(keys, []string{"big", "small"}) {
		t.Fatalf("SCAN: %q", keys)
	}
	now = at // the deadline itself: gone
	for _, key := range []string{"small", "big"} {
		if ok, _ := s.Exists(ctx, key); ok {
			t.Fatalf("EXISTS %s after its deadline", key)
		}
		if _, err := s.Stat(ctx, key); !errors.Is(err, resp.ErrNotFound) {
			t.Fatalf("STAT %s after its deadline: %v", key, err)
		}
		mustMiss(t, s, key)
		if _, err := s.Expire(ctx, key, time.Time{}); !errors.Is(err, resp.ErrNotFound) {
			t.Fatalf("PERSIST %s after its deadline: %v", key, err)
		}
	}
	if c := blocksIn(n, respnode.ChunkNamespace) + blocksIn(n, index.RESPNamespace); c != 0 {
		t.Fatalf("%d blocks left of expired keys that reads met", c)
	}
	// EXPIRE and PERSIST rewrite the record, small or chunked.
	for key, v := range map[string][]byte{"small": []byte("v"), "big": big} {
		if err := s.Set(ctx, key, v); err != nil {
			t.Fatal(err)
		}
		if old, err := s.Expire(ctx, key, now.Add(time.Minute)); err != nil || !old.IsZero() {
			t.Fatalf("EXPIRE %s: %v %v", key, old, err)
		}
		if old, err := s.Expire(ctx, key, time.Time{}); err != nil || !old.Equal(now.Add(time.Minute)) {
			t.Fatalf("PERSIST %s: %v %v", key, old, err)
		}
		mustGet(t, s, key, v)
		if info, _ := s.Stat(ctx, key); !info.ExpireAt.IsZero() {
			t.Fatalf("%s keeps deadline %v after PERSIST", key, info.ExpireAt)
		}
		if _, err := s.Expire(ctx, key, now); err != nil {
			t.Fatal(err)
		}
		mustMiss(t, s, key)
	}
	if c := blocksIn(n, respnode.ChunkNamespace) + blocksIn(n, index.RESPNamespace); c != 0 {
		t.Fatalf("%d blocks left after EXPIRE in the past", c)
	}
	if _, err := s.Expire(ctx, "nothing", now.Add(time.Hour)); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("EXPIRE of a missing key: %v", err)
	}
}

func scanAll(t *testing.T, s *respnode.Store) []string {
	t.Helper()
	var all []string
	var cursor uint64
	for range 1000 {
		keys, next, err := s.Scan(context.Background(), cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, keys...)
		if cursor = next; cursor == 0 {
			slices.Sort(all)
			return all
		}
	}
	t.Fatal("SCAN did not end in 1000 calls")
	return nil
}

// SCAN returns every key present throughout, once, whatever COUNT.
func TestRESPScanVisitsEveryKey(t *testing.T) {
	_, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	var want []string
	for i := range 50 {
		key := fmt.Sprintf("key:%02d", i)
		want = append(want, key)
		if err := s.Set(ctx, key, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	for _, count := range []int{1, 7, 100} {
		var got []string
		var cursor uint64
		for {
			keys, next, err := s.Scan(ctx, cursor, count)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, keys...)
			if next >= 1<<32 {
				t.Fatalf("COUNT %d: cursor %d uses the top 32 bits, which respcluster needs free", count, next)
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("COUNT %d: scanned %d keys %q, want the 50", count, len(got), got)
		}
	}
	if _, _, err := s.Scan(ctx, 1<<40, 10); err == nil {
		t.Fatal("SCAN of a cursor over 32 bits, which the store never returns: no error")
	}
}

// Apply changes every key or none: when a value's chunks cannot all be
// stored, after the other keys' records were reserved, every key reads as
// it was and no chunk is left behind.
func TestRESPApplyIsAllOrNothing(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, DRAMBytes: 1 << 20, SSDBytes: 1 << 20, Inline: true})
	ctx := context.Background()
	for _, key := range []string{"a", "b", "gone"} {
		if err := s.Set(ctx, key, []byte("old "+key)); err != nil {
			t.Fatal(err)
		}
	}
	// Pinned, the old values stay on the node whatever the big value evicts.
	pin, _, err := n.Pin([]index.Key{index.RESPKey("a"), index.RESPKey("b"), index.RESPKey("gone")}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Apply(ctx, []resp.Write{
		{Key: "a", Value: []byte("new a")},
		{Key: "gone", Delete: true},
		{Key: "b", Value: []byte("new b")},
		{Key: "huge", Value: randomValue(3<<20, 5)}, // 3 MiB into 2 MiB of tiers
	})
	if !errors.Is(err, resp.ErrFull) {
		t.Fatalf("Apply of a value over the tiers: %v, want ErrFull", err)
	}
	for _, key := range []string{"a", "b", "gone"} {
		mustGet(t, s, key, []byte("old "+key))
	}
	mustMiss(t, s, "huge")
	if c := blocksIn(n, respnode.ChunkNamespace); c != 0 {
		t.Fatalf("%d chunks left by a failed Apply", c)
	}
	// The same batch without the big value applies whole; later writes of
	// a key win.
	if err := n.Release(pin); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, []resp.Write{
		{Key: "a", Value: []byte("first a")},
		{Key: "gone", Delete: true},
		{Key: "b", Value: []byte("new b")},
		{Key: "a", Value: []byte("new a")},
		{Key: "c", Value: randomValue(2*block, 6), ExpireAt: time.Now().Add(time.Hour)},
	}); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "a", []byte("new a"))
	mustGet(t, s, "b", []byte("new b"))
	mustGet(t, s, "c", randomValue(2*block, 6))
	mustMiss(t, s, "gone")
	if info, _ := s.Stat(ctx, "c"); info.ExpireAt.IsZero() {
		t.Fatal("Apply dropped a write's deadline")
	}
}

// A record too long for one block is refused before anything changes.
func TestRESPKeyTooLongIsRefused(t *testing.T) {
	_, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	long := string(make([]byte, block))
	if err := s.Set(ctx, long, []byte("v")); !errors.Is(err, resp.ErrTooLarge) {
		t.Fatalf("SET of a key of one block: %v, want ErrTooLarge", err)
	}
	if err := s.Apply(ctx, []resp.Write{{Key: "k", Value: []byte("v")}, {Key: long, Value: []byte("v")}}); !errors.Is(err, resp.ErrTooLarge) {
		t.Fatalf("Apply with a key of one block: %v, want ErrTooLarge", err)
	}
	mustMiss(t, s, "k")
}

// Blocks written before records carried deadlines (key length, key,
// value) still read, as values with no deadline, and are rewritten in the
// new form when their deadline changes.
func TestRESPReadsRecordsOfTheFirstFormat(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	b := append([]byte{3, 0, 0, 0}, "old"...)
	b = append(b, "value"...)
	h := index.Header{Key: index.RESPKey("old"), Sum: index.Checksum(b)}
	h.Size = uint32(len(b))
	if err := n.Put(h, b); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "old", []byte("value"))
	if info, err := s.Stat(ctx, "old"); err != nil || info.Size != 5 || !info.ExpireAt.IsZero() {
		t.Fatalf("STAT: %+v %v", info, err)
	}
	at := time.Now().Add(time.Hour)
	if _, err := s.Expire(ctx, "old", at); err != nil {
		t.Fatal(err)
	}
	mustGet(t, s, "old", []byte("value"))
	if info, _ := s.Stat(ctx, "old"); !info.ExpireAt.Equal(time.Unix(0, at.UnixNano())) {
		t.Fatalf("deadline %v after EXPIRE, want %v", info.ExpireAt, at)
	}
}

// A GET racing SETs of a chunked value reads one of the values whole,
// never a mix or a short one.
func TestRESPChunkedReadsRacingWritesSeeWholeValues(t *testing.T) {
	_, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	values := [][]byte{randomValue(6*block, 10), randomValue(6*block, 11), randomValue(2*block, 12)}
	if err := s.Set(ctx, "k", values[0]); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			if err := s.Set(ctx, "k", values[i%3]); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for reads := 0; ; reads++ {
		select {
		case <-done:
			return
		default:
		}
		got, err := get(t, s, "k")
		if errors.Is(err, resp.ErrNotFound) {
			continue // replaced during three reads in a row
		}
		if err != nil || !slices.ContainsFunc(values, func(v []byte) bool { return bytes.Equal(v, got) }) {
			t.Fatalf("read %d: %d bytes, %v; want one of the values written, whole", reads, len(got), err)
		}
	}
}

// streamed reads key through ViewStream: the pieces of a chunked value, or
// the one piece of a small one.
func streamed(t *testing.T, s *respnode.Store, key string) ([]byte, int, error) {
	t.Helper()
	v, err := s.ViewStream(context.Background(), key)
	if err != nil {
		return nil, 0, err
	}
	if v.Stream == nil {
		out := bytes.Clone(v.Bytes)
		v.Release()
		return out, 1, nil
	}
	var out []byte
	pieces := 0
	err = v.Stream(func(p []byte) error {
		out = append(out, p...)
		pieces++
		return nil
	})
	if int64(len(out)) != v.Size {
		t.Fatalf("stream of %d bytes announced %d", len(out), v.Size)
	}
	return out, pieces, err
}

// GET streams a chunked value chunk by chunk; a value that lost a chunk
// is a miss before anything is streamed.
func TestRESPViewStreamHandsOutChunks(t *testing.T) {
	n, s := newNodeStore(t, nodetest.Options{Limits: node.Config{MaxBlockSize: block}, Inline: true})
	ctx := context.Background()
	big, small := randomValue(5*block+3, 7), []byte("small")
	if err := s.Set(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "small", small); err != nil {
		t.Fatal(err)
	}
	if got, pieces, err := streamed(t, s, "big"); err != nil || pieces != 6 || !bytes.Equal(got, big) {
		t.Fatalf("stream of a chunked value: %d bytes in %d pieces, %v", len(got), pieces, err)
	}
	if got, pieces, err := streamed(t, s, "small"); err != nil || pieces != 1 || !bytes.Equal(got, small) {
		t.Fatalf("stream of a small value: %q in %d pieces, %v", got, pieces, err)
	}
	if _, _, err := streamed(t, s, "nothing"); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("stream of a missing key: %v", err)
	}
	// The stream stops at emit's first error.
	v, err := s.ViewStream(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	stop, calls := errors.New("client gone"), 0
	if err := v.Stream(func([]byte) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("stream after emit failed: %v after %d calls", err, calls)
	}
	chunks := n.Hierarchy().Blocks(func(b tiers.BlockInfo) bool { return b.Key.NS == respnode.ChunkNamespace })
	if err := n.Hierarchy().Delete(chunks[0].Key); err != nil {
		t.Fatal(err)
	}
	if _, _, err := streamed(t, s, "big"); !errors.Is(err, resp.ErrNotFound) {
		t.Fatalf("stream of a value that lost a chunk: %v, want a miss", err)
	}
	if c := blocksIn(n, respnode.ChunkNamespace); c != 0 {
		t.Fatalf("%d chunks left of a value that lost one", c)
	}
}

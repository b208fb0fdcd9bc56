package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/engine/model"
	"github.com/kvstrata/kvstrata/engine/model/tiny"
	"github.com/kvstrata/kvstrata/engine/tokenizer"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/s3/s3test"
)

// The correctness bar of engine/model/tiny across the cache's restore
// paths, with real processes: a prompt (o200k tokens) whose full blocks'
// KV was computed by tiny, stored in a kvstrata node with their chain
// parents and restored from DRAM, SSD, the object store or another node of
// a cluster, then prefilled only from where the restore stopped, gives
// bit-identical logits and greedy tokens — prefill and a few decode steps —
// to a full recompute. A block missing in the middle, or one that is not
// the child of the block before it, stops the restore there, and what is
// recomputed from there is identical too.

// tinyRef is the test's model, prompt and full recompute, computed once.
type tinyRef struct {
	m      *tiny.Model
	lay    model.Layout
	ns     index.NamespaceID
	toks   []uint32      // the prompt
	hashes []index.Hash  // of its full blocks
	blocks []model.Block // its full blocks' KV, as a full prefill computed it
	logits [][]float32   // the full recompute's: the prefill's, then each decode step's
	out    []uint32      // the full recompute's greedy tokens
}

// tinyDecodeSteps is how many tokens are decoded after the prefill's.
const tinyDecodeSteps = 4

var tinyOnce struct {
	sync.Once
	ref *tinyRef
	err error
}

// tinyReference returns the shared reference, computing it on first use.
func tinyReference(t *testing.T) *tinyRef {
	t.Helper()
	tinyOnce.Do(func() { tinyOnce.ref, tinyOnce.err = newTinyRef() })
	if tinyOnce.err != nil {
		t.Fatal(tinyOnce.err)
	}
	return tinyOnce.ref
}

func newTinyRef() (*tinyRef, error) {
	tok, err := tokenizer.O200k()
	if err != nil {
		return nil, err
	}
	toks := tok.Encode("The cache exists for inference workers. A prefill worker computes the keys and values " +
		"of every token of a prompt, layer by layer; the full blocks go to kvstrata, which keeps them in DRAM, " +
		"moves them to SSD as they cool, and to the object store after that. A decode worker, or the same worker " +
		"an hour later, asks for the longest prefix the cache holds and computes only the rest.")
	if len(toks) < 4*16 || len(toks)%16 == 0 { // a few blocks of 16 and a partial one
		return nil, fmt.Errorf("the prompt is %d tokens; want at least 4 blocks of 16 and a partial one", len(toks))
	}
	// The model's whole structure at a width that keeps -race quick; the
	// vocabulary is o200k's, which the prompt's token ids need.
	m, err := tiny.New(tiny.Config{Layers: 2, Dim: 32, Heads: 4, KVHeads: 2, HeadDim: 8, Hidden: 64,
		Vocab: tokenizer.O200kVocab, BlockTokens: 16, ContextLen: 256})
	if err != nil {
		return nil, err
	}
	r := &tinyRef{m: m, lay: m.Layout(), ns: m.Layout().Namespace.ID(), toks: toks}
	r.hashes = r.lay.Namespace.Hashes(toks)
	res, err := m.Prefill(context.Background(), []model.Seq{{Tokens: toks}})
	if err != nil {
		return nil, err
	}
	r.blocks = res.Blocks[0][:len(r.hashes)]
	if r.logits, r.out, err = r.generate(nil); err != nil {
		return nil, err
	}
	return r, nil
}

// generate prefills the prompt with the KV of its first len(prefix) blocks
// given, then decodes tinyDecodeSteps tokens greedily, returning every
// step's logits and the tokens.
func (r *tinyRef) generate(prefix []model.Block) ([][]float32, []uint32, error) {
	ctx := context.Background()
	bt := r.lay.Namespace.BlockTokens
	toks := slices.Clone(r.toks)
	cached := len(prefix) * bt
	var logits [][]float32
	var out []uint32
	for step := 0; step <= tinyDecodeSteps; step++ {
		batch := []model.Seq{{Tokens: toks, Cached: cached, Prefix: prefix}}
		var res model.Result
		var lg [][]float32
		var err error
		if step == 0 {
			res, lg, err = r.m.PrefillLogits(ctx, batch)
		} else {
			res, lg, err = r.m.DecodeLogits(ctx, batch)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("step %d: %w", step, err)
		}
		logits, out = append(logits, lg[0]), append(out, res.Next[0])
		// The step's blocks start with the one holding token cached.
		prefix = append(prefix[:cached/bt:cached/bt], res.Blocks[0]...)
		cached = len(toks)
		toks = append(toks, res.Next[0])
	}
	return logits, out, nil
}

// checkIdentical fails unless prefilling after the restored blocks gives
// the full recompute's logits, bit for bit, and tokens.
func (r *tinyRef) checkIdentical(t *testing.T, what string, restored []model.Block) {
	t.Helper()
	for i, b := range restored {
		if !bytes.Equal(bytes.Join(b.Layers, nil), bytes.Join(r.blocks[i].Layers, nil)) {
			t.Fatalf("%s: restored block %d differs from the computed one", what, i)
		}
	}
	logits, out, err := r.generate(restored)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !slices.Equal(out, r.out) {
		t.Fatalf("%s: tokens %v, the full recompute's are %v", what, out, r.out)
	}
	for s := range logits {
		if i := firstBitDiff(logits[s], r.logits[s]); i >= 0 {
			t.Fatalf("%s: step %d logit %d is %v, the full recompute's is %v", what, s, i, logits[s][i], r.logits[s][i])
		}
	}
}

// firstBitDiff is the first index where a and b differ in their bits, or
// -1 if they are identical.
func firstBitDiff(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// put stores the prompt's full blocks through c as one chain.
func (r *tinyRef) put(t *testing.T, c *client.Client) {
	t.Helper()
	data := make([][]byte, len(r.blocks))
	for i, b := range r.blocks {
		data[i] = bytes.Join(b.Layers, nil)
	}
	if err := c.Put(context.Background(), client.Chain(r.ns, r.hashes, data)); err != nil {
		t.Fatal(err)
	}
	syncDir(t, c)
}

// syncDir waits until the directory events c's node made so far are
// committed, so that its lookups see them.
func syncDir(t *testing.T, c *client.Client) {
	t.Helper()
	if err := syncNode(c, 10*time.Second); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

func (r *tinyRef) keys() []index.Key {
	keys := make([]index.Key, len(r.hashes))
	for i, h := range r.hashes {
		keys[i] = index.Key{NS: r.ns, Hash: h}
	}
	return keys
}

// getFunc is client.Client.GetFunc or client.ClusterClient.GetFunc.
type getFunc func(context.Context, []index.Key, client.GetOptions, func(int, client.Result) error) error

var errStopRestore = errors.New("stop the restore here")

// restore is what an engine does on admission: it fetches the prompt's
// full blocks in chain order straight into one buffer, and stops at the
// first block that is missing, unreadable, of the wrong size or not the
// child of the block before it. It returns the blocks restored, cut into
// the model's layers, and the node each came from.
func (r *tinyRef) restore(t *testing.T, get getFunc) ([]model.Block, []index.NodeID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bb, lb, bt := r.lay.BlockBytes(), r.lay.LayerBytes(), r.lay.Namespace.BlockTokens
	dst := make([]byte, len(r.hashes)*bb)
	var out []model.Block
	var from []index.NodeID
	err := get(ctx, r.keys(), client.GetOptions{StopAtMiss: true, Buffer: func(i, size int) []byte {
		if size != bb { // refused below; it must not land in dst
			return make([]byte, size)
		}
		return dst[i*bb : (i+1)*bb]
	}}, func(i int, res client.Result) error {
		chained := i == 0 && !res.HasParent || i > 0 && res.HasParent && res.Parent == r.hashes[i-1]
		if !res.Found || len(res.Data) != bb || !chained || i != len(out) {
			return errStopRestore
		}
		b := model.Block{Index: i, Tokens: bt, Hash: r.hashes[i], Layers: make([][]byte, r.lay.Namespace.Layout.Layers)}
		for l := range b.Layers {
			b.Layers[l] = res.Data[l*lb : (l+1)*lb : (l+1)*lb]
		}
		out, from = append(out, b), append(from, res.Node)
		return nil
	})
	if err != nil && !errors.Is(err, errStopRestore) {
		t.Fatalf("restore: %v", err)
	}
	return out, from
}

// heldIn is how many leading blocks of the prompt a lookup on c finds in
// tier (on any node).
func (r *tinyRef) heldIn(t *testing.T, c *client.Client, tier string) uint32 {
	t.Helper()
	lr, err := c.Lookup(context.Background(), r.ns, r.hashes)
	if err != nil {
		t.Fatal(err)
	}
	var n uint32
	for _, tb := range lr.Tiers {
		if tb.Tier == tier {
			n = max(n, tb.Blocks)
		}
	}
	return n
}

// demote moves the namespace's blocks from tier to the next one down.
func (r *tinyRef) demote(t *testing.T, c *client.Client, tier string) {
	t.Helper()
	if _, err := c.Evict(context.Background(), &pb.EvictRequest{HasNamespace: true, Namespace: uint64(r.ns), Tier: tier, Demote: true, MaxListed: 1}); err != nil {
		t.Fatalf("demote from %s: %v", tier, err)
	}
	syncDir(t, c)
}

func TestTinyRestoredFromDRAMAndSSDDecodesBitIdenticallyAndStopsAtABrokenChain(t *testing.T) {
	r := tinyReference(t)
	full := len(r.hashes)
	p := startNode(t, t.TempDir())
	c := p.api()
	r.put(t, c)

	if n := r.heldIn(t, c, "dram"); n != uint32(full) {
		t.Fatalf("DRAM holds %d leading blocks of %d", n, full)
	}
	restored, _ := r.restore(t, c.GetFunc)
	if len(restored) != full {
		t.Fatalf("restored %d blocks of %d from DRAM", len(restored), full)
	}
	r.checkIdentical(t, "restored from DRAM", restored)

	r.demote(t, c, "dram")
	if d, s := r.heldIn(t, c, "dram"), r.heldIn(t, c, "ssd"); d != 0 || s != uint32(full) {
		t.Fatalf("after demoting: DRAM holds %d leading blocks, SSD %d; want 0 and %d", d, s, full)
	}
	restored, _ = r.restore(t, c.GetFunc)
	if len(restored) != full {
		t.Fatalf("restored %d blocks of %d from SSD", len(restored), full)
	}
	r.checkIdentical(t, "restored from SSD", restored)

	// Block 2 evicted from every tier: the restore stops there, and the
	// engine recomputes from block 2 on.
	const hole = 2
	if _, err := c.Evict(context.Background(), &pb.EvictRequest{Keys: []*pb.BlockKey{{Namespace: uint64(r.ns), Hash: uint64(r.hashes[hole])}}}); err != nil {
		t.Fatal(err)
	}
	syncDir(t, c)
	restored, _ = r.restore(t, c.GetFunc)
	if len(restored) != hole {
		t.Fatalf("with block %d evicted the restore gave %d blocks, want %d", hole, len(restored), hole)
	}
	r.checkIdentical(t, "restored up to an evicted block", restored)

	// Block 2 back under its key, but with block 3's bytes and block 3's
	// parent: not the child of block 1. The restore stops there too.
	wrong := bytes.Join(r.blocks[hole+1].Layers, nil)
	if err := c.Put(context.Background(), []client.Block{{Key: index.Key{NS: r.ns, Hash: r.hashes[hole]},
		Parent: r.hashes[hole], HasParent: true, Data: wrong}}); err != nil {
		t.Fatal(err)
	}
	restored, _ = r.restore(t, c.GetFunc)
	if len(restored) != hole {
		t.Fatalf("with block %d on the wrong chain the restore gave %d blocks, want %d", hole, len(restored), hole)
	}
	r.checkIdentical(t, "restored up to a block on the wrong chain", restored)

	// What the chain check saves the engine from: those bytes taken as
	// block 2's KV change the output.
	bad := slices.Clone(r.blocks[:hole+1])
	bad[hole] = model.Block{Index: hole, Tokens: r.lay.Namespace.BlockTokens, Hash: r.hashes[hole], Layers: r.blocks[hole+1].Layers}
	logits, _, err := r.generate(bad)
	if err != nil {
		t.Fatal(err)
	}
	if firstBitDiff(logits[0], r.logits[0]) < 0 {
		t.Fatal("a wrong block's KV gave the full recompute's logits: the test proves nothing")
	}
}

func TestTinyRestoredFromTheObjectStoreDecodesBitIdentically(t *testing.T) {
	r := tinyReference(t)
	full := uint32(len(r.hashes))
	srv := s3test.Start(t)
	p := startNode(t, t.TempDir(), s3Flags(srv)...)
	c := p.api()
	r.put(t, c)
	for _, tier := range []string{"dram", "ssd"} {
		r.demote(t, c, tier)
	}
	eventually(t, 20*time.Second, "the object store's uploads finish", func() bool {
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s3 := st.Tiers[len(st.Tiers)-1]
		return s3.Tier == "s3" && s3.Detail["pending_bytes"] == 0
	})
	if d, s, o := r.heldIn(t, c, "dram"), r.heldIn(t, c, "ssd"), r.heldIn(t, c, "s3"); d != 0 || s != 0 || o != full {
		t.Fatalf("after demoting: DRAM holds %d leading blocks, SSD %d, s3 %d; want 0, 0 and %d", d, s, o, full)
	}
	restored, _ := r.restore(t, c.GetFunc)
	if len(restored) != int(full) {
		t.Fatalf("restored %d blocks of %d from the object store", len(restored), full)
	}
	r.checkIdentical(t, "restored from the object store", restored)
}

func TestTinyRestoredFromAnotherNodeDecodesBitIdentically(t *testing.T) {
	r := tinyReference(t)
	full := len(r.hashes)
	nodes := startCluster(t, loopback(2))
	a, b := nodes[0], nodes[1]
	r.put(t, a.api())
	eventually(t, 5*time.Second, "a lookup on node 2 finds node 1's blocks", func() bool {
		return lookupAt(t, b.api(), r.ns, r.hashes, 1) == uint32(full)
	})
	cl := client.NewClusterClient(b.api(), client.Options{})
	defer cl.Close()
	restored, from := r.restore(t, cl.GetFunc)
	if len(restored) != full {
		t.Fatalf("restored %d blocks of %d through node 2", len(restored), full)
	}
	for i, id := range from {
		if id != 1 {
			t.Fatalf("block %d came from node %d, want node 1", i, id)
		}
	}
	r.checkIdentical(t, "restored from another node", restored)
}

package kvconn

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/api/client"
	"github.com/kvstrata/kvstrata/api/node"
	"github.com/kvstrata/kvstrata/api/nodetest"
	"github.com/kvstrata/kvstrata/index"
)

// ctx5 is a test call's context: its deadline only keeps a broken test
// from hanging.
func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// An offloaded prompt is found by Lookup and loaded, byte for byte, into
// the caller's buffers; the metrics count it.
func TestOffloadThenLookupThenLoad(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	c, reg := newConn(t, n.Addr, nil)
	p := newPrompt(7, 1, 8)

	c.Offload(p.ns, p.blocks(0, 8))
	eventually(t, "8 blocks offloaded", func() bool { return metric(t, reg, "kvstrata_engine_offload_blocks_total") == 8 })
	if got := metric(t, reg, "kvstrata_engine_offload_bytes_total"); got != 8*blockSize {
		t.Fatalf("offload bytes %v, want %d", got, 8*blockSize)
	}

	held, err := c.Lookup(ctx5(t), p.ns, p.hashes)
	if err != nil || held != 8 {
		t.Fatalf("Lookup = %d, %v; want 8 blocks", held, err)
	}
	dst := newPool(8)
	loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst)
	if err != nil || loaded != 8 {
		t.Fatalf("Load = %d, %v; want 8 blocks", loaded, err)
	}
	checkLoaded(t, dst, p, 8)

	// The data plane does not name the tier; the Lookup before did.
	if got := metric(t, reg, "kvstrata_engine_onboard_blocks_total", "tier", "dram"); got != 8 {
		t.Fatalf("onboard blocks %v, want 8", got)
	}
	if got := metric(t, reg, "kvstrata_engine_onboard_bytes_total", "tier", "dram"); got != 8*blockSize {
		t.Fatalf("onboard bytes %v, want %d", got, 8*blockSize)
	}
	if got := metric(t, reg, "kvstrata_engine_onboard_seconds"); got != 1 {
		t.Fatalf("%v onboard latencies observed, want 1", got)
	}
	if got := metric(t, reg, "kvstrata_engine_cache_errors_total", "op", "load"); got != 0 {
		t.Fatalf("%v load errors, want none", got)
	}
}

// Of a chain whose first blocks the cache holds, Lookup reports and Load
// fetches exactly those; the buffers past them are not written.
func TestPartialChainLoadsItsPrefix(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	c, reg := newConn(t, n.Addr, nil)
	p := newPrompt(7, 2, 6)
	if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(0, 3)); err != nil {
		t.Fatal(err)
	}
	// Block 4 is held too, but after a gap: not part of the prefix.
	if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(4, 5)); err != nil {
		t.Fatal(err)
	}

	if held, err := c.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != 3 {
		t.Fatalf("Lookup = %d, %v; want 3 blocks", held, err)
	}
	dst := newPool(6)
	loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst)
	if err != nil || loaded != 3 {
		t.Fatalf("Load = %d, %v; want 3 blocks and no error (a miss is none)", loaded, err)
	}
	checkLoaded(t, dst, p, 3)
	for i := 3; i < 6; i++ {
		if !bytes.Equal(dst[i], make([]byte, blockSize)) {
			t.Fatalf("block %d's buffer was written past the prefix", i)
		}
	}
	if got := metric(t, reg, "kvstrata_engine_onboard_blocks_total", "tier", "dram"); got != 3 {
		t.Fatalf("onboard blocks %v, want 3", got)
	}
}

// A decode worker loads from the node a prefill worker's params name,
// which its own node knows nothing of; the client of that node is kept.
func TestLoadFromNamedNode(t *testing.T) {
	own := nodetest.Start(t, nodetest.Options{})
	other := nodetest.Start(t, nodetest.Options{})
	prefill, _ := newConn(t, own.Addr, nil)
	decode, reg := newConn(t, own.Addr, nil)
	p := newPrompt(9, 3, 5)

	if at, err := prefill.Store(ctx5(t), other.Addr, p.ns, p.blocks(0, 5)); err != nil || at != other.Addr {
		t.Fatalf("Store at %s = %q, %v; want the blocks there", other.Addr, at, err)
	}
	if held, err := decode.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != 0 {
		t.Fatalf("the decode worker's own node: Lookup = %d, %v; want 0", held, err)
	}
	for range 2 {
		dst := newPool(5)
		loaded, err := decode.Load(ctx5(t), other.Addr, p.ns, p.hashes, dst.dst)
		if err != nil || loaded != 5 {
			t.Fatalf("Load from %s = %d, %v; want 5 blocks", other.Addr, loaded, err)
		}
		checkLoaded(t, dst, p, 5)
	}
	if got := metric(t, reg, "kvstrata_engine_onboard_blocks_total", "tier", "remote"); got != 10 {
		t.Fatalf("onboard blocks from the other node %v, want 10", got)
	}
	decode.peers.mu.Lock()
	clients := len(decode.peers.nodes)
	decode.peers.mu.Unlock()
	if clients != 2 {
		t.Fatalf("the Conn keeps %d clients, want 2: its own node's and the other's, each dialled once", clients)
	}
}

// A block whose bytes no longer match their checksum ends the load there,
// over the data plane and over gRPC alike: the blocks before it are
// loaded, it and the rest are not counted, and the error says why.
func TestCorruptBlockStopsTheLoad(t *testing.T) {
	for _, grpcOnly := range []bool{false, true} {
		name := map[bool]string{false: "data-plane", true: "grpc"}[grpcOnly]
		t.Run(name, func(t *testing.T) {
			n := nodetest.Start(t, nodetest.Options{})
			c, reg := newConn(t, n.Addr, func(cfg *Config) { cfg.Client.NoDataPlane = grpcOnly })
			p := newPrompt(7, 4, 5)
			if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(0, 5)); err != nil {
				t.Fatal(err)
			}
			// DRAM trusts memory: a byte flipped in its arena is served as
			// it is, with the block's checksum, and found out by the client
			// on arrival.
			v, _, err := n.View(index.Key{NS: p.ns, Hash: p.hashes[2]})
			if err != nil {
				t.Fatal(err)
			}
			v.Bytes()[blockSize/2] ^= 0xff
			if err := v.Release(); err != nil {
				t.Fatal(err)
			}

			dst := newPool(5)
			loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst)
			if loaded != 2 || !errors.Is(err, client.ErrCorrupt) {
				t.Fatalf("Load = %d, %v; want 2 blocks and client.ErrCorrupt", loaded, err)
			}
			checkLoaded(t, dst, p, 2)
			// Over gRPC the node names the tier; over the data plane it is
			// unknown (no Lookup came first): the worker's own node.
			tier := map[bool]string{false: "cache", true: "dram"}[grpcOnly]
			if got := metric(t, reg, "kvstrata_engine_onboard_blocks_total", "tier", tier); got != 2 {
				t.Fatalf("onboard blocks from %s %v, want 2: a corrupt block is never counted", tier, got)
			}
			if got := metric(t, reg, "kvstrata_engine_cache_errors_total", "op", "load"); got != 1 {
				t.Fatalf("load errors %v, want 1", got)
			}
		})
	}
}

// Blocks are counted by the tier that holds them, as the Lookup before the
// Load named it (the data plane does not say); without a Lookup, as from
// the worker's own node.
func TestOnboardCountedByTier(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{Inline: true})
	c, reg := newConn(t, n.Addr, nil)
	p := newPrompt(7, 12, 3)
	if _, err := c.Store(ctx5(t), "", p.ns, p.blocks(0, 3)); err != nil {
		t.Fatal(err)
	}
	ns := p.ns
	if _, err := n.Evict(node.Selector{Namespace: &ns, Tier: index.TierDRAM, Demote: true}); err != nil {
		t.Fatal(err)
	}

	if held, err := c.Lookup(ctx5(t), p.ns, p.hashes); err != nil || held != 3 {
		t.Fatalf("Lookup = %d, %v; want 3", held, err)
	}
	dst := newPool(3)
	if loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst); err != nil || loaded != 3 {
		t.Fatalf("Load = %d, %v; want 3", loaded, err)
	}
	checkLoaded(t, dst, p, 3)

	other := newPrompt(8, 13, 1) // in DRAM, and never looked up
	if _, err := c.Store(ctx5(t), "", other.ns, other.blocks(0, 1)); err != nil {
		t.Fatal(err)
	}
	if loaded, err := c.Load(ctx5(t), "", other.ns, other.hashes, newPool(1).dst); err != nil || loaded != 1 {
		t.Fatalf("Load = %d, %v; want 1", loaded, err)
	}
	for tier, want := range map[string]float64{"ssd": 3, "cache": 1, "dram": 0} {
		if got := metric(t, reg, "kvstrata_engine_onboard_blocks_total", "tier", tier); got != want {
			t.Errorf("onboard blocks from %s: %v, want %v", tier, got, want)
		}
	}
}

// A block of another size than the engine's is not loaded.
func TestBlockOfAnotherSizeStopsTheLoad(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	c, _ := newConn(t, n.Addr, nil)
	p := newPrompt(7, 5, 3)
	blocks := p.blocks(0, 3)
	blocks[1].Data = blocks[1].Data[:blockSize/2]
	if _, err := c.Store(ctx5(t), "", p.ns, blocks); err != nil {
		t.Fatal(err)
	}
	dst := newPool(3)
	loaded, err := c.Load(ctx5(t), "", p.ns, p.hashes, dst.dst)
	if loaded != 1 || !errors.Is(err, ErrBlockSize) {
		t.Fatalf("Load = %d, %v; want 1 block and ErrBlockSize", loaded, err)
	}
	checkLoaded(t, dst, p, 1)
}

// Blocks one worker stores are loaded by another worker's Conn; a Store
// at a node that is not there fails with an error the caller can test.
func TestStoreThenLoadFromAnotherConn(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{})
	writer, reg := newConn(t, n.Addr, nil)
	reader, _ := newConn(t, n.Addr, nil)
	p := newPrompt(3, 6, 4)
	if at, err := writer.Store(ctx5(t), "", p.ns, p.blocks(0, 4)); err != nil || at != n.Addr {
		t.Fatalf("Store at the worker's own node = %q, %v; want the blocks at %s", at, err, n.Addr)
	}
	if got := metric(t, reg, "kvstrata_engine_offload_blocks_total"); got != 4 {
		t.Fatalf("stored blocks counted %v, want 4", got)
	}
	dst := newPool(4)
	if loaded, err := reader.Load(ctx5(t), "", p.ns, p.hashes, dst.dst); err != nil || loaded != 4 {
		t.Fatalf("Load = %d, %v; want 4 blocks", loaded, err)
	}
	checkLoaded(t, dst, p, 4)

	_, err := writer.Store(ctx5(t), freeAddr(t), p.ns, p.blocks(0, 1))
	if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Store at an address nothing listens on: %v, want client.ErrUnavailable", err)
	}
	if got := metric(t, reg, "kvstrata_engine_cache_errors_total", "op", "store"); got != 1 {
		t.Fatalf("store errors %v, want 1", got)
	}
}

// A block the node refuses is dropped and counted, and the offloader goes
// on with the next ones.
func TestOffloadRefusedBlockIsDropped(t *testing.T) {
	n := nodetest.Start(t, nodetest.Options{Limits: node.Config{MaxBlockSize: blockSize}})
	c, reg := newConn(t, n.Addr, nil)
	p := newPrompt(7, 14, 3)
	blocks := p.blocks(0, 3) // one batch
	blocks[0].Data = make([]byte, 2*blockSize)
	c.Offload(p.ns, blocks)
	eventually(t, "the two blocks after the refused one offloaded", func() bool {
		return metric(t, reg, "kvstrata_engine_offload_blocks_total") == 2
	})
	if got := metric(t, reg, "kvstrata_engine_offload_dropped_blocks_total"); got != 1 {
		t.Fatalf("dropped %v blocks, want the refused one", got)
	}
	if got := metric(t, reg, "kvstrata_engine_cache_errors_total", "op", "offload"); got != 1 {
		t.Fatalf("offload errors %v, want 1", got)
	}
}

//go:build cuda

package hbm

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// overDRAM stacks an HBM tier over a DRAM tier, each of capacity bytes,
// with blocks up to maxBlock; the hierarchy pins DRAM's arena for the
// device.
func overDRAM(tb testing.TB, capacity, maxBlock int64) (*tiers.Hierarchy, *Tier, *dram.Tier) {
	tb.Helper()
	hb := open(tb, Config{Capacity: capacity, MaxBlockSize: maxBlock})
	d, err := dram.New(dram.Config{Capacity: capacity, MaxBlockSize: maxBlock})
	if err != nil {
		hb.Close()
		tb.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{Node: 1, Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: hb},
		{Kind: index.TierDRAM, Tier: d},
	}})
	if err != nil {
		hb.Close()
		d.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	if hb.Detail()["pinned_host_bytes"] != int64(len(d.HostArena())) {
		tb.Fatalf("the HBM tier pinned %d bytes; want DRAM's arena, %d", hb.Detail()["pinned_host_bytes"], len(d.HostArena()))
	}
	return h, hb, d
}

// copied returns the bytes the tier has copied to and from pinned host
// memory (DMA) and other host memory (staged) so far.
func copied(hb *Tier) (dma, staged int64) {
	d := hb.Detail()
	return d["dma_bytes"], d["staged_bytes"]
}

// Demotion copies a block from device memory straight into the room DRAM
// reserved for it, and promotion from DRAM's arena straight to the device:
// both as DMA, none of it staged, and the bytes arrive whole (the stand-in
// driver carries a copy out only when its stream is synchronized, so a
// reservation committed before that would hold zeros).
func TestDemotionAndPromotionCopyBetweenTheDeviceAndPinnedDRAM(t *testing.T) {
	h, hb, d := overDRAM(t, 16<<20, 4<<20)
	for i, size := range []int{64 << 10, 1 << 20, 4<<20 - 1} {
		m, v := tiertest.Block(index.Hash(i+1), size)
		if err := h.Put(m, v); err != nil {
			t.Fatal(err)
		}
		dma, staged := copied(hb)
		if err := h.Demote(index.TierHBM, m.Key); err != nil {
			t.Fatal(err)
		}
		if got, _, err := d.Get(m.Key, nil); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%d bytes demoted: %v, equal %v", size, err, bytes.Equal(got, v))
		}
		if ok, err := h.PromoteTo(index.TierHBM, m.Key); !ok || err != nil {
			t.Fatalf("promoting %d bytes: %v, %v", size, ok, err)
		}
		dma2, staged2 := copied(hb)
		if dma2-dma != 2*int64(size) || staged2 != staged {
			t.Fatalf("a demotion and a promotion of %d bytes copied %d bytes as DMA and %d staged; want %d and 0",
				size, dma2-dma, staged2-staged, 2*size)
		}
		if got, _, err := hb.Get(m.Key, nil); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("%d bytes promoted: %v, equal %v", size, err, bytes.Equal(got, v))
		}
	}
}

// A copy that fails on the device aborts DRAM's reservation: DRAM holds
// nothing of the block and its room is free again, and the block is still
// served, whole, from HBM.
func TestAFailedDeviceCopyAbortsTheDemotionAndLosesNothing(t *testing.T) {
	h, hb, d := overDRAM(t, 4<<20, 1<<20)
	m, v := tiertest.Block(1, 1<<20)
	if err := h.Put(m, v); err != nil {
		t.Fatal(err)
	}
	if !cudatest.FailCopies(1) {
		t.Skip("the machine's CUDA driver cannot be made to fail a copy")
	}
	err := h.Demote(index.TierHBM, m.Key)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Op != "cuStreamSynchronize" {
		t.Fatalf("a demotion whose copy failed: %v; want the stream's synchronization to fail", err)
	}
	if st := d.Stats(); st.Used != 0 || st.Blocks != 0 {
		t.Fatalf("DRAM after the failed copy: %+v; want nothing held", st)
	}
	got, _, kind, err := h.Get(m.Key, nil)
	if err != nil || kind != index.TierHBM || !bytes.Equal(got, v) {
		t.Fatalf("after the failed demotion: %v from %v, equal %v", err, kind, bytes.Equal(got, v))
	}
	if err := h.Demote(index.TierHBM, m.Key); err != nil {
		t.Fatalf("the demotion again: %v", err)
	}
	if got, _, err := d.Get(m.Key, nil); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("after the second demotion: %v, equal %v", err, bytes.Equal(got, v))
	}
	if hb.Stats().Blocks != 0 {
		t.Fatalf("HBM still holds %d blocks after the demotion", hb.Stats().Blocks)
	}
}

// Moving a block between HBM and DRAM puts none of its bytes on the Go
// heap: a demotion, a promotion and the drop of DRAM's copy, of a 1 MiB
// block, allocate a small fraction of it (bookkeeping), where a buffer in
// either direction would be the whole MiB.
func TestMovingABlockBetweenHBMAndDRAMAllocatesNoBuffer(t *testing.T) {
	h, _, _ := overDRAM(t, 4<<20, 1<<20)
	m, v := tiertest.Block(1, 1<<20)
	if err := h.Put(m, v); err != nil {
		t.Fatal(err)
	}
	round := func() {
		if err := h.Demote(index.TierHBM, m.Key); err != nil {
			t.Fatal(err)
		}
		if _, err := h.PromoteTo(index.TierHBM, m.Key); err != nil {
			t.Fatal(err)
		}
		if err := h.DeleteFrom(index.TierDRAM, m.Key); err != nil {
			t.Fatal(err)
		}
	}
	round()
	const rounds = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range rounds {
		round()
	}
	runtime.ReadMemStats(&after)
	perRound := (after.TotalAlloc - before.TotalAlloc) / rounds
	allocs := testing.AllocsPerRun(rounds, round)
	t.Logf("a round trip of 1 MiB allocates %d bytes in %.0f allocations", perRound, allocs)
	if perRound >= 64<<10 {
		t.Fatalf("a round trip of a 1 MiB block allocates %d bytes on the heap; want well under 64 KiB", perRound)
	}
}

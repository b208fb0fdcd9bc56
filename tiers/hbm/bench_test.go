//go:build cuda

package hbm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// BenchmarkHBMDRAMCopy measures moving one block between HBM and DRAM
// through the tiers beside the driver's own copies of the same bytes
// between device memory and pinned host memory, at each block size:
//
//	demote-tier     the HBM tier's CopyOut into a DRAM reservation, committed
//	demote-raw      cuMemcpyDtoHAsync into pinned memory, synchronized
//	promote-tier    the HBM tier's Put from DRAM's arena (a View)
//	promote-raw     cuMemcpyHtoDAsync from pinned memory, synchronized
//	roundtrip-tier  Hierarchy.Demote, PromoteTo and DeleteFrom(DRAM)
//	roundtrip-raw   demote-raw then promote-raw
//
// MB/s counts the block's bytes once a direction (twice a round trip), so
// tier ÷ raw is the share of the bus the tiers get (bench/gpu.sh prints
// it). On the stand-in driver the numbers are memcpy's and say nothing of
// a GPU.
func BenchmarkHBMDRAMCopy(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchCopy(b, size) })
	}
}

func benchCopy(b *testing.B, size int) {
	h, hb, d := overDRAM(b, 4*int64(size), int64(size))
	m, v := tiertest.Block(1, size)
	if err := h.Put(m, v); err != nil {
		b.Fatal(err)
	}

	b.Run("demote-tier", func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			r, err := d.Reserve(m)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := hb.CopyOut(m.Key, r.Bytes()); err != nil {
				b.Fatal(err)
			}
			if err := r.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("promote-tier", func(b *testing.B) {
		view, err := d.View(m.Key, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		defer view.Release()
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			if err := hb.Put(view.Meta(), view.Bytes()); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("roundtrip-tier", func(b *testing.B) {
		// demote-tier's copy, which h does not record (gone on a second run)
		if err := d.Delete(m.Key); err != nil && !errors.Is(err, tiers.ErrNotFound) {
			b.Fatal(err)
		}
		b.SetBytes(2 * int64(size))
		b.ReportAllocs()
		for b.Loop() {
			if err := h.Demote(index.TierHBM, m.Key); err != nil {
				b.Fatal(err)
			}
			if _, err := h.PromoteTo(index.TierHBM, m.Key); err != nil {
				b.Fatal(err)
			}
			if err := h.DeleteFrom(index.TierDRAM, m.Key); err != nil {
				b.Fatal(err)
			}
		}
	})

	raw := newRawCopy(b, size)
	b.Run("demote-raw", func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			raw.out(b)
		}
	})
	b.Run("promote-raw", func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			raw.in(b)
		}
	})
	b.Run("roundtrip-raw", func(b *testing.B) {
		b.SetBytes(2 * int64(size))
		b.ReportAllocs()
		for b.Loop() {
			raw.out(b)
			raw.in(b)
		}
	})
}

// rawCopy is the driver alone: size bytes of device memory, as many of
// pinned host memory mapped as the DRAM tier maps its arena, one stream.
type rawCopy struct {
	dev  *cuda.Device
	dptr cuda.DevPtr
	host []byte
	s    *cuda.Stream
}

func newRawCopy(b *testing.B, size int) *rawCopy {
	drv, err := cuda.Load()
	if err != nil {
		b.Fatal(err)
	}
	r := &rawCopy{}
	if r.dev, err = drv.Open(0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.dev.Close() })
	if r.dptr, err = r.dev.Alloc(int64(size)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.dev.Free(r.dptr) })
	if r.host, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(r.host) })
	if err := r.dev.RegisterHost(r.host); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.dev.UnregisterHost(r.host) })
	if r.s, err = r.dev.NewStream(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.s.Close() })
	r.in(b) // the device memory holds the bytes before the first copy out
	return r
}

func (r *rawCopy) out(b *testing.B) {
	if err := r.s.DtoH(r.host, r.dptr); err != nil {
		b.Fatal(err)
	}
	if err := r.s.Sync(); err != nil {
		b.Fatal(err)
	}
}

func (r *rawCopy) in(b *testing.B) {
	if err := r.s.HtoD(r.dptr, r.host); err != nil {
		b.Fatal(err)
	}
	if err := r.s.Sync(); err != nil {
		b.Fatal(err)
	}
}

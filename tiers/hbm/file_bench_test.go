//go:build cuda

package hbm

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// BenchmarkSSDToHBM measures reading one block from its file into device
// memory (FillFromFile: a promotion out of the SSD tier) beside a pread of
// the same bytes into host memory (what an SSD-to-DRAM read costs), at each
// block size:
//
//	fill-MODE          FillFromFile on a tier with Config.GDS auto; MODE is
//	                   how it reads here: gds, compat (cuFile without
//	                   nvidia-fs) or staged (no cuFile); checked
//	fill-MODE-trusted  the same with GDSTrustDisk (cuFile only)
//	fill-staged        through the pinned staging buffers (when MODE is not)
//	pread              pread into mmapped host memory, unchecked
//
// The block lies in a file in $TMPDIR at a 4 KiB-aligned offset, and each
// read starts with the file's pages dropped from the page cache
// (posix_fadvise DONTNEED), so both sides read the disk; on tmpfs the
// pages stay. bench/gpu.sh prints the ratio fill ÷ pread. On the stand-in
// driver and library the numbers are pread's and memcpy's and say nothing
// of a GPU.
func BenchmarkSSDToHBM(b *testing.B) {
	for _, size := range []int{1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchFill(b, size) })
	}
}

func benchFill(b *testing.B, size int) {
	if skip != "" {
		b.Skip(skip)
	}
	_, v := tiertest.Block(1, size)
	e := tiertest.BlockFile(b, 4096, v)[0]
	fd := int(e.F.Fd())
	cold := func() { _ = unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED) }
	base := Config{Capacity: 4 * int64(size), PageSize: 64 << 10, MaxBlockSize: int64(size)}
	probe := open(b, base)
	mode, _ := probe.FileReads()
	probe.Close()
	type variant struct {
		name string
		gds  string
		trst bool
	}
	variants := []variant{{"fill-" + mode, GDSAuto, false}}
	if mode != "staged" {
		variants = append(variants, variant{"fill-" + mode + "-trusted", GDSAuto, true}, variant{"fill-staged", GDSStaged, false})
	}
	for _, vr := range variants {
		b.Run(vr.name, func(b *testing.B) {
			cfg := base
			cfg.GDS, cfg.GDSTrustDisk = vr.gds, vr.trst
			tr := open(b, cfg)
			defer tr.Close()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				cold()
				if err := tr.FillFromFile(e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("pread", func(b *testing.B) {
		host, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Munmap(host)
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			cold()
			if _, err := e.F.ReadAt(host, e.Off); err != nil {
				b.Fatal(err)
			}
		}
	})
}

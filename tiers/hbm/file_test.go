//go:build cuda

package hbm

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/gpu/cufile/cufiletest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/ssd"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// unaligned is a file header after which no block is aligned.
const unaligned = tiertest.FileHeader

// sizes of the blocks the tests fill: empty, a few bytes, and several
// staging chunks and a bit.
var sizes = []int{0, 100, 3*stagingChunk + 7}

func values() [][]byte {
	var vs [][]byte
	for i, n := range sizes {
		_, v := tiertest.Block(index.Hash(100+i), n)
		vs = append(vs, v)
	}
	return vs
}

// Every way of reading a file fills the blocks with their bytes and
// counts them under its own name.
func TestFillFromFileReadsEachWay(t *testing.T) {
	type way struct {
		name    string
		cfg     Config
		gds     bool   // the stand-in reports nvidia-fs
		mode    int64  // gds_mode
		counter string // where the bytes are counted
		cuFile  bool
	}
	for _, w := range []way{
		{"staged", Config{GDS: GDSStaged}, false, modeStaged, "file_staged_bytes", false},
		{"compat", Config{}, false, modeCompat, "gds_compat_bytes", true},
		{"gds", Config{}, true, modeGDS, "gds_bytes", true},
		{"gds-trusted", Config{GDSTrustDisk: true}, true, modeGDS, "gds_bytes", true},
	} {
		t.Run(w.name, func(t *testing.T) {
			if w.cuFile && skipCuFile != "" {
				t.Skip(skipCuFile)
			}
			if w.cuFile && !cufiletest.SetGDS(w.gds) {
				t.Skip("the machine's cuFile library: its mode is the machine's")
			}
			defer cufiletest.SetGDS(false)
			cfg := w.cfg
			cfg.Capacity, cfg.PageSize, cfg.MaxBlockSize = 16<<20, 4096, 4<<20
			tr := open(t, cfg)
			defer tr.Close()
			vs := values()
			exts := tiertest.BlockFile(t, unaligned, vs...)
			var total int64
			for i, e := range exts {
				if err := tr.FillFromFile(e); err != nil {
					t.Fatalf("block of %d bytes: %v", sizes[i], err)
				}
				total += int64(sizes[i])
			}
			for i, e := range exts {
				got, m, err := tr.Get(e.M.Key, nil)
				if err != nil || m != e.M || !bytes.Equal(got, vs[i]) {
					t.Fatalf("block of %d bytes: %v, meta %v, equal %v", sizes[i], err, m == e.M, bytes.Equal(got, vs[i]))
				}
			}
			d := tr.Detail()
			if d["gds_mode"] != w.mode || d[w.counter] != total || d["file_fills"] != int64(len(exts)) {
				t.Fatalf("Detail %v; want gds_mode %d, %s %d, file_fills %d", d, w.mode, w.counter, total, len(exts))
			}
			verified := int64(0)
			if w.cuFile && !cfg.GDSTrustDisk {
				verified = total
			}
			if d["file_verified_bytes"] != verified {
				t.Fatalf("file_verified_bytes %d, want %d", d["file_verified_bytes"], verified)
			}
			if w.cuFile && d["gds_registered_bytes"] != tr.size {
				t.Fatalf("gds_registered_bytes %d; want the pool, %d", d["gds_registered_bytes"], tr.size)
			}
		})
	}
}

// A block whose bytes in the file do not match its checksum is not
// stored, and an older block of its key stays; likewise one whose file is
// short.
func TestACorruptOrShortFileStoresNothing(t *testing.T) {
	for _, cfg := range []Config{{GDS: GDSStaged}, {GDS: GDSAuto}} {
		t.Run(cfg.GDS, func(t *testing.T) {
			if cfg.GDS == GDSAuto && skipCuFile != "" {
				t.Skip(skipCuFile)
			}
			cfg.Capacity, cfg.PageSize, cfg.MaxBlockSize = 16<<20, 4096, 4<<20
			tr := open(t, cfg)
			defer tr.Close()
			vs := values()
			exts := tiertest.BlockFile(t, unaligned, vs...)
			e := exts[2]
			old := bytes.Repeat([]byte{1}, 5000)
			om, _ := tiertest.Block(0, len(old))
			om.Key, om.Sum = e.M.Key, index.Checksum(old)
			if err := tr.Put(om, old); err != nil {
				t.Fatal(err)
			}
			used := tr.Stats().Used
			bad := *e
			bad.M.Sum++
			if err := tr.FillFromFile(&bad); !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("a fill with the wrong checksum: %v; want ErrCorrupt", err)
			}
			short := *e
			short.Off += 10 // past the file's end by 10 bytes
			short.M.Sum = 0
			if err := tr.FillFromFile(&short); err == nil || errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("a fill past the file's end: %v; want a read error", err)
			}
			if st := tr.Stats(); st.Used != used || st.Blocks != 1 {
				t.Fatalf("after the failed fills: %+v; want %d bytes in 1 block", st, used)
			}
			if got, _, err := tr.Get(e.M.Key, nil); err != nil || !bytes.Equal(got, old) {
				t.Fatalf("the older block: %v, equal %v", err, bytes.Equal(got, old))
			}
			if d := tr.Detail(); d["file_corrupt"] != 1 || d["file_fills"] != 0 {
				t.Fatalf("Detail %v; want file_corrupt 1, file_fills 0", d)
			}
		})
	}
}

// A cuFile read that fails is done again through the staging buffers.
func TestAFailedCuFileReadIsDoneAgainStaged(t *testing.T) {
	if skip == "" && skipCuFile != "" {
		t.Skip(skipCuFile)
	}
	tr := open(t, Config{Capacity: 16 << 20, PageSize: 4096, MaxBlockSize: 4 << 20})
	defer tr.Close()
	if !cufiletest.FailReads(1) {
		t.Skip("the machine's cuFile library cannot be told to fail")
	}
	vs := values()
	e := tiertest.BlockFile(t, unaligned, vs...)[2]
	if err := tr.FillFromFile(e); err != nil {
		t.Fatal(err)
	}
	if got, _, err := tr.Get(e.M.Key, nil); err != nil || !bytes.Equal(got, vs[2]) {
		t.Fatalf("%v, equal %v", err, bytes.Equal(got, vs[2]))
	}
	n := int64(sizes[2])
	if d := tr.Detail(); d["gds_errors"] != 1 || d["file_staged_bytes"] != n || d["gds_compat_bytes"] != 0 {
		t.Fatalf("Detail %v; want gds_errors 1, file_staged_bytes %d", d, n)
	}
}

// A staged copy that fails on the device stores nothing.
func TestAFailedStagedCopyStoresNothing(t *testing.T) {
	tr := open(t, Config{Capacity: 16 << 20, PageSize: 4096, MaxBlockSize: 4 << 20, GDS: GDSStaged})
	defer tr.Close()
	if !cudatest.FailCopies(1) {
		t.Skip("the machine's driver cannot be told to fail")
	}
	e := tiertest.BlockFile(t, unaligned, values()...)[2]
	if err := tr.FillFromFile(e); err == nil {
		t.Fatal("a fill whose copy failed succeeded")
	}
	if st := tr.Stats(); st.Used != 0 || st.Blocks != 0 {
		t.Fatalf("after the failed fill: %+v", st)
	}
	if err := tr.FillFromFile(e); err != nil {
		t.Fatalf("the fill again: %v", err)
	}
}

// The tier registers each file once, however many blocks it reads from
// it, and lets go of its handles and the pool's registration at Close.
func TestCuFileHandlesAreKeptPerFileAndReleasedAtClose(t *testing.T) {
	if skip == "" && skipCuFile != "" {
		t.Skip(skipCuFile)
	}
	tr := open(t, Config{Capacity: 16 << 20, PageSize: 4096, MaxBlockSize: 4 << 20})
	n0, ok := cufiletest.Handles()
	if !ok {
		tr.Close()
		t.Skip("the machine's cuFile library does not say")
	}
	a, b := tiertest.BlockFile(t, unaligned, values()...), tiertest.BlockFile(t, unaligned, values()...)
	for _, e := range append(a, b...) {
		if err := tr.FillFromFile(e); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := cufiletest.Handles(); n != n0+2 {
		t.Fatalf("%d handles registered for 2 files", n-n0)
	}
	if r, _ := cufiletest.RegisteredBytes(); r < tr.size {
		t.Fatalf("%d bytes registered; want the pool, %d", r, tr.size)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := cufiletest.Handles(); n != n0 {
		t.Fatalf("%d handles left registered after Close", n-n0)
	}
	if r, _ := cufiletest.RegisteredBytes(); r != 0 {
		t.Fatalf("%d bytes left registered after Close", r)
	}
}

func TestFillingFromFilesCanBeTurnedOff(t *testing.T) {
	if _, err := Open(Config{Capacity: 1 << 20, GDS: "always"}); !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("GDS \"always\": %v; want ErrInvalidConfig", err)
	}
	tr := open(t, Config{Capacity: 1 << 20, PageSize: 4096, GDS: GDSOff})
	defer tr.Close()
	e := tiertest.BlockFile(t, unaligned, values()[1])[0]
	if err := tr.FillFromFile(e); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FillFromFile with GDS off: %v; want errors.ErrUnsupported", err)
	}
	if mode, _ := tr.FileReads(); mode != "off" || tr.Detail()["gds_mode"] != modeOff {
		t.Fatalf("mode %q, gds_mode %d", mode, tr.Detail()["gds_mode"])
	}
}

// In a hierarchy, a block promoted out of a level that keeps it in a file
// is read into device memory by FillFromFile, and a corrupt file leaves
// nothing in HBM and is a miss.
func TestPromotionFromAFileLevelFillsFromTheFile(t *testing.T) {
	hb := open(t, Config{Capacity: 8 << 20, PageSize: 4096, MaxBlockSize: 1 << 20, GDS: GDSStaged})
	ft := tiertest.NewFileTier(t, 64<<20, 1<<20)
	want := map[index.Key][]byte{}
	for i := range 3 {
		m, v := tiertest.Block(index.Hash(i+1), 1<<20-i)
		if err := ft.Put(m, v); err != nil {
			t.Fatal(err)
		}
		want[m.Key] = v
	}
	h, err := tiers.New(tiers.Config{Node: 1, Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: hb},
		{Kind: index.TierSSD, Tier: ft},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	k1, k2 := index.Key{NS: 7, Hash: 1}, index.Key{NS: 7, Hash: 2}
	if got, _, kind, err := h.Get(k1, nil); err != nil || kind != index.TierSSD || !bytes.Equal(got, want[k1]) {
		t.Fatalf("the first read: %v from %v", err, kind)
	}
	if got, _, kind, err := h.Get(k1, nil); err != nil || kind != index.TierHBM || !bytes.Equal(got, want[k1]) {
		t.Fatalf("the read after the promotion: %v from %v", err, kind)
	}
	if d := hb.Detail(); d["file_fills"] != 1 || d["file_staged_bytes"] != int64(len(want[k1])) {
		t.Fatalf("Detail %v; want one fill of %d bytes", d, len(want[k1]))
	}
	fd, err := os.OpenFile(ft.Path(k2), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte{0x5a}, tiertest.FileHeader+12345); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	if _, err := h.PromoteTo(index.TierHBM, k2); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("the promotion of a corrupt block: %v, want ErrCorrupt", err)
	}
	if _, err := hb.Stat(k2); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("HBM's Stat of the corrupt block: %v, want ErrNotFound", err)
	}
	if _, _, _, err := h.Get(k2, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("the corrupt block: %v, want a miss", err)
	}
	if d := hb.Detail(); d["file_corrupt"] != 1 || d["file_fills"] != 1 {
		t.Fatalf("Detail %v; want file_corrupt 1", d)
	}
}

// Fills from several goroutines at once, more than there are streams and
// staging buffers, each come out whole.
func TestConcurrentFills(t *testing.T) {
	for _, gds := range []string{GDSStaged, GDSAuto} {
		t.Run(gds, func(t *testing.T) {
			tr := open(t, Config{Capacity: 32 << 20, PageSize: 4096, MaxBlockSize: 2 << 20, Streams: 2, GDS: gds})
			defer tr.Close()
			var vs [][]byte
			for i := range 6 {
				_, v := tiertest.Block(index.Hash(500+i), 1<<20+i*4099)
				vs = append(vs, v)
			}
			exts := tiertest.BlockFile(t, unaligned, vs...)
			errs := make(chan error, len(exts))
			for _, e := range exts {
				go func() { errs <- tr.FillFromFile(e) }()
			}
			for range exts {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for i, e := range exts {
				if got, _, err := tr.Get(e.M.Key, nil); err != nil || !bytes.Equal(got, vs[i]) {
					t.Fatalf("block %d: %v, equal %v", i, err, bytes.Equal(got, vs[i]))
				}
			}
		})
	}
}

// A block the SSD tier keeps in a block file of its own is promoted into
// HBM from that file (the SSD tier is a FileLocator), and comes back whole;
// a block small enough to live inside the SSD tier's Pebble store is
// promoted through its Get.
func TestPromotionFromTheSSDTierReadsItsBlockFiles(t *testing.T) {
	hb := open(t, Config{Capacity: 8 << 20, PageSize: 4096, MaxBlockSize: 1 << 20, GDS: GDSStaged})
	st, err := ssd.Open(ssd.Config{Dir: t.TempDir(), Capacity: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	large, vl := tiertest.Block(1, 1<<20)
	small, vs := tiertest.Block(2, 1000)
	blocks := []struct {
		m index.Header
		v []byte
	}{{large, vl}, {small, vs}}
	for _, b := range blocks {
		if err := st.Put(b.m, b.v); err != nil {
			t.Fatal(err)
		}
	}
	h, err := tiers.New(tiers.Config{Node: 1, Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: hb},
		{Kind: index.TierSSD, Tier: st},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, b := range blocks {
		if _, err := h.PromoteTo(index.TierHBM, b.m.Key); err != nil {
			t.Fatalf("promoting %v: %v", b.m.Key, err)
		}
		got, _, kind, err := h.Get(b.m.Key, nil)
		if err != nil || kind != index.TierHBM || !bytes.Equal(got, b.v) {
			t.Fatalf("%v after its promotion: %v from %v, equal %v", b.m.Key, err, kind, bytes.Equal(got, b.v))
		}
	}
	if d := hb.Detail(); d["file_fills"] != 1 || d["file_staged_bytes"] != int64(len(vl)) {
		t.Fatalf("Detail %v; want one fill, of the large block's %d bytes", d, len(vl))
	}
}

//go:build cuda

package hbm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/gpu/cufile/cufiletest"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// extent is a tiers.FileExtent over a real file on disk.
type extent struct {
	f    *os.File
	off  int64
	meta index.Header
}

func (e *extent) File() tiers.BlockFile { return e.f }
func (e *extent) Offset() int64         { return e.off }
func (e *extent) Meta() index.Header    { return e.meta }
func (e *extent) Release() error        { return nil }

// blockFile writes blocks one after another into a new file, after a
// header of header bytes, and returns an extent for each, on one open file
// closed with the test.
func blockFile(t testing.TB, header int, blocks ...[]byte) []*extent {
	t.Helper()
	p := filepath.Join(t.TempDir(), "blocks")
	data := bytes.Repeat([]byte{0xee}, header)
	var exts []*extent
	for i, v := range blocks {
		m, _ := tiertest.Block(index.Hash(i+1), len(v))
		m.Sum = index.Checksum(v)
		exts = append(exts, &extent{off: int64(len(data)), meta: m})
		data = append(data, v...)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	for _, e := range exts {
		e.f = f
	}
	return exts
}

// unaligned is a file header after which no block is aligned.
const unaligned = 4096 + 100

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
			exts := blockFile(t, unaligned, vs...)
			var total int64
			for i, e := range exts {
				if err := tr.FillFromFile(e); err != nil {
					t.Fatalf("block of %d bytes: %v", sizes[i], err)
				}
				total += int64(sizes[i])
			}
			for i, e := range exts {
				got, m, err := tr.Get(e.meta.Key, nil)
				if err != nil || m != e.meta || !bytes.Equal(got, vs[i]) {
					t.Fatalf("block of %d bytes: %v, meta %v, equal %v", sizes[i], err, m == e.meta, bytes.Equal(got, vs[i]))
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
			exts := blockFile(t, unaligned, vs...)
			e := exts[2]
			old := bytes.Repeat([]byte{1}, 5000)
			om, _ := tiertest.Block(0, len(old))
			om.Key, om.Sum = e.meta.Key, index.Checksum(old)
			if err := tr.Put(om, old); err != nil {
				t.Fatal(err)
			}
			used := tr.Stats().Used
			bad := *e
			bad.meta.Sum++
			if err := tr.FillFromFile(&bad); !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("a fill with the wrong checksum: %v; want ErrCorrupt", err)
			}
			short := *e
			short.off += 10 // past the file's end by 10 bytes
			short.meta.Sum = 0
			if err := tr.FillFromFile(&short); err == nil || errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("a fill past the file's end: %v; want a read error", err)
			}
			if st := tr.Stats(); st.Used != used || st.Blocks != 1 {
				t.Fatalf("after the failed fills: %+v; want %d bytes in 1 block", st, used)
			}
			if got, _, err := tr.Get(e.meta.Key, nil); err != nil || !bytes.Equal(got, old) {
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
	e := blockFile(t, unaligned, vs...)[2]
	if err := tr.FillFromFile(e); err != nil {
		t.Fatal(err)
	}
	if got, _, err := tr.Get(e.meta.Key, nil); err != nil || !bytes.Equal(got, vs[2]) {
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
	e := blockFile(t, unaligned, values()...)[2]
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
	a, b := blockFile(t, unaligned, values()...), blockFile(t, unaligned, values()...)
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
	e := blockFile(t, unaligned, values()[1])[0]
	if err := tr.FillFromFile(e); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("FillFromFile with GDS off: %v; want errors.ErrUnsupported", err)
	}
	if mode, _ := tr.FileReads(); mode != "off" || tr.Detail()["gds_mode"] != modeOff {
		t.Fatalf("mode %q, gds_mode %d", mode, tr.Detail()["gds_mode"])
	}
}

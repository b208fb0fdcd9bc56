package tiertest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// FileHeader is how many bytes FileTier writes before a block in its file,
// so that no block starts at offset 0 or on a page.
const FileHeader = 4096 + 100

// FileTier is a tier for tests that keeps each block whole in a file of
// its own in a directory, after FileHeader bytes, and says where
// (tiers.FileLocator), as the SSD tier does for large blocks: the other
// side of a tiers.FileFiller. Its Get checks the bytes against the Sum and
// drops a corrupt block, as a tier must. It is not persistent: a new
// FileTier holds nothing.
type FileTier struct {
	dir      string
	maxBlock int64
	capacity int64

	mu     sync.Mutex
	metas  map[index.Key]index.Header
	inline bool
	gets   int
	open   int // extents not yet released
}

var _ tiers.FileLocator = (*FileTier)(nil)

// NewFileTier returns an empty FileTier in a temporary directory of tb.
func NewFileTier(tb testing.TB, capacity, maxBlock int64) *FileTier {
	return &FileTier{dir: tb.TempDir(), maxBlock: maxBlock, capacity: capacity, metas: map[index.Key]index.Header{}}
}

// Path is the file holding key's block.
func (f *FileTier) Path(k index.Key) string {
	return filepath.Join(f.dir, fmt.Sprintf("%x-%x", k.NS, k.Hash))
}

// SetInline makes LocateFile answer ErrNotFound (on) for every block, as a
// tier does for blocks it keeps elsewhere than in files of their own.
func (f *FileTier) SetInline(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inline = on
}

// Counts returns how many Gets the tier served and how many extents it
// handed out are not released yet.
func (f *FileTier) Counts() (gets, open int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets, f.open
}

func (f *FileTier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, f.maxBlock); err != nil {
		return err
	}
	b := append(bytes.Repeat([]byte{0xee}, FileHeader), value...)
	if err := os.WriteFile(f.Path(m.Key), b, 0o644); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metas[m.Key] = m
	return nil
}

func (f *FileTier) Get(k index.Key, dst []byte) ([]byte, index.Header, error) {
	f.mu.Lock()
	m, ok := f.metas[k]
	f.gets++
	f.mu.Unlock()
	if !ok {
		return dst, index.Header{}, fmt.Errorf("filetier: %v: %w", k, tiers.ErrNotFound)
	}
	b, err := os.ReadFile(f.Path(k))
	if err != nil {
		return dst, index.Header{}, err
	}
	if len(b) != FileHeader+int(m.Size) || index.Checksum(b[FileHeader:]) != m.Sum {
		_ = f.Delete(k)
		return dst, index.Header{}, fmt.Errorf("filetier: %v: %w", k, tiers.ErrCorrupt)
	}
	return append(dst, b[FileHeader:]...), m, nil
}

func (f *FileTier) Stat(k index.Key) (index.Header, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.metas[k]; ok {
		return m, nil
	}
	return index.Header{}, fmt.Errorf("filetier: %v: %w", k, tiers.ErrNotFound)
}

func (f *FileTier) Delete(k index.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.metas[k]; !ok {
		return fmt.Errorf("filetier: %v: %w", k, tiers.ErrNotFound)
	}
	delete(f.metas, k)
	return os.Remove(f.Path(k))
}

func (f *FileTier) Scan(fn func(index.Header) bool) error {
	f.mu.Lock()
	ms := make([]index.Header, 0, len(f.metas))
	for _, m := range f.metas {
		ms = append(ms, m)
	}
	f.mu.Unlock()
	for _, m := range ms {
		if !fn(m) {
			break
		}
	}
	return nil
}

func (f *FileTier) Stats() tiers.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	var used int64
	for _, m := range f.metas {
		used += int64(m.Size)
	}
	return tiers.Stats{Capacity: f.capacity, Used: used, Blocks: int64(len(f.metas))}
}

func (f *FileTier) Close() error { return nil }

// LocateFile opens key's file and returns where its block lies; the
// extent's Release closes the file.
func (f *FileTier) LocateFile(k index.Key) (tiers.FileExtent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.metas[k]
	if !ok || f.inline {
		return nil, fmt.Errorf("filetier: %v: %w", k, tiers.ErrNotFound)
	}
	file, err := os.Open(f.Path(k))
	if err != nil {
		return nil, err
	}
	f.open++
	return &Extent{F: file, Off: FileHeader, M: m, release: func() {
		f.mu.Lock()
		f.open--
		f.mu.Unlock()
	}}, nil
}

// Extent is a tiers.FileExtent over an open file.
type Extent struct {
	F       *os.File
	Off     int64
	M       index.Header
	release func()
}

func (e *Extent) File() tiers.BlockFile { return e.F }
func (e *Extent) Offset() int64         { return e.Off }
func (e *Extent) Meta() index.Header    { return e.M }

// Release closes the file of an extent FileTier handed out; it does
// nothing to one of BlockFile.
func (e *Extent) Release() error {
	if e.release == nil {
		return nil
	}
	e.release()
	return e.F.Close()
}

// BlockFile writes the blocks one after another into a new file in a
// temporary directory of tb, after header bytes, and returns an extent for
// each (keys 1, 2, …, in namespace Block's), on the one open file, closed
// with tb.
func BlockFile(tb testing.TB, header int, blocks ...[]byte) []*Extent {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "blocks")
	data := bytes.Repeat([]byte{0xee}, header)
	var exts []*Extent
	for i, v := range blocks {
		m, _ := Block(index.Hash(i+1), len(v))
		m.Sum = index.Checksum(v)
		exts = append(exts, &Extent{Off: int64(len(data)), M: m})
		data = append(data, v...)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	for _, e := range exts {
		e.F = f
	}
	return exts
}

// testFileFiller checks FillFromFile: blocks of several sizes read from
// a file at unaligned offsets come back whole; one whose bytes fail their
// Sum is refused with ErrCorrupt and leaves the tier as it was, an older
// block of its key included.
func testFileFiller(t *testing.T, f Factory) {
	tr := f.open(t, 16<<20, 4<<20)
	ff := extra[tiers.FileFiller](t, tr)
	var vs [][]byte
	for i, n := range []int{0, 1, 4099, 3<<20 + 7} {
		_, v := Block(index.Hash(1000+i), n)
		vs = append(vs, v)
	}
	exts := BlockFile(t, FileHeader, vs...)
	for i, e := range exts {
		if err := ff.FillFromFile(e); errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("the tier fills no blocks from files: %v", err)
		} else if err != nil {
			t.Fatalf("FillFromFile of %d bytes: %v", len(vs[i]), err)
		}
	}
	for i, e := range exts {
		got, m, err := tr.Get(e.M.Key, nil)
		if err != nil || m != e.M || !bytes.Equal(got, vs[i]) {
			t.Fatalf("the block of %d bytes: %v, meta as filled %v, equal %v", len(vs[i]), err, m == e.M, bytes.Equal(got, vs[i]))
		}
	}
	before := tr.Stats()
	bad := *exts[3]
	bad.M.Sum++
	if err := ff.FillFromFile(&bad); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("FillFromFile of bytes that fail their Sum: %v; want ErrCorrupt", err)
	}
	if after := tr.Stats(); after != before {
		t.Fatalf("the refused fill changed the tier: %+v, was %+v", after, before)
	}
	if got, _, err := tr.Get(exts[3].M.Key, nil); err != nil || !bytes.Equal(got, vs[3]) {
		t.Fatalf("the block the refused fill would have replaced: %v, equal %v", err, bytes.Equal(got, vs[3]))
	}
}

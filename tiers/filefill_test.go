package tiers_test

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
	"github.com/kvstrata/kvstrata/tiers/dram"
)

// fileTier keeps each block in a file of its own on disk, after a header
// of fileHeader bytes (so that a block's offset is not 0), and hands out
// where (tiers.FileLocator), as the SSD tier does for large blocks. Its
// Get checks the bytes and drops a corrupt block, as a tier must. With
// inline set it answers LocateFile with ErrNotFound: blocks it keeps
// elsewhere than in files.
type fileTier struct {
	dir    string
	inline bool

	mu       sync.Mutex
	metas    map[index.Key]index.Header
	gets     int
	open     int // extents not yet released
	closed   bool
	capacity int64
}

const fileHeader = 512

var _ tiers.FileLocator = (*fileTier)(nil)

func newFileTier(t *testing.T) *fileTier {
	return &fileTier{dir: t.TempDir(), metas: map[index.Key]index.Header{}, capacity: 64 * blockSize}
}

func (f *fileTier) path(k index.Key) string {
	return filepath.Join(f.dir, fmt.Sprintf("%x-%x", k.NS, k.Hash))
}

func (f *fileTier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, blockSize); err != nil {
		return err
	}
	b := append(bytes.Repeat([]byte{0xee}, fileHeader), value...)
	if err := os.WriteFile(f.path(m.Key), b, 0o644); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metas[m.Key] = m
	return nil
}

func (f *fileTier) Get(k index.Key, dst []byte) ([]byte, index.Header, error) {
	f.mu.Lock()
	m, ok := f.metas[k]
	f.gets++
	f.mu.Unlock()
	if !ok {
		return dst, index.Header{}, tiers.ErrNotFound
	}
	b, err := os.ReadFile(f.path(k))
	if err != nil {
		return dst, index.Header{}, err
	}
	if index.Checksum(b[fileHeader:]) != m.Sum {
		_ = f.Delete(k)
		return dst, index.Header{}, fmt.Errorf("fileTier: %v: %w", k, tiers.ErrCorrupt)
	}
	return append(dst, b[fileHeader:]...), m, nil
}

func (f *fileTier) Stat(k index.Key) (index.Header, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.metas[k]; ok {
		return m, nil
	}
	return index.Header{}, tiers.ErrNotFound
}

func (f *fileTier) Delete(k index.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.metas[k]; !ok {
		return tiers.ErrNotFound
	}
	delete(f.metas, k)
	return os.Remove(f.path(k))
}

func (f *fileTier) Scan(fn func(index.Header) bool) error {
	f.mu.Lock()
	var ms []index.Header
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

func (f *fileTier) Stats() tiers.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	var used int64
	for _, m := range f.metas {
		used += int64(m.Size)
	}
	return tiers.Stats{Capacity: f.capacity, Used: used, Blocks: int64(len(f.metas))}
}

func (f *fileTier) Close() error { f.closed = true; return nil }

func (f *fileTier) LocateFile(k index.Key) (tiers.FileExtent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.metas[k]
	if !ok || f.inline {
		return nil, fmt.Errorf("fileTier: %v: %w", k, tiers.ErrNotFound)
	}
	file, err := os.Open(f.path(k))
	if err != nil {
		return nil, err
	}
	f.open++
	return &fileExtent{f: f, file: file, meta: m}, nil
}

type fileExtent struct {
	f    *fileTier
	file *os.File
	meta index.Header
}

func (e *fileExtent) File() tiers.BlockFile { return e.file }
func (e *fileExtent) Offset() int64         { return fileHeader }
func (e *fileExtent) Meta() index.Header    { return e.meta }
func (e *fileExtent) Release() error {
	e.f.mu.Lock()
	e.f.open--
	e.f.mu.Unlock()
	return e.file.Close()
}

// fillerTier stands in for a device tier (hbm) over a real DRAM tier,
// its extras hidden but FileFiller: FillFromFile reads the extent with
// ReadAt and stores the bytes only if they match the Sum. With off set it
// refuses, as a tier configured not to fill from files does.
type fillerTier struct {
	tiers.Tier // a DRAM tier

	mu    sync.Mutex
	fills int
	puts  int
	off   bool
}

var _ tiers.FileFiller = (*fillerTier)(nil)

func (c *fillerTier) Put(m index.Header, value []byte) error {
	c.mu.Lock()
	c.puts++
	c.mu.Unlock()
	return c.Tier.Put(m, value)
}

func (c *fillerTier) FillFromFile(ext tiers.FileExtent) error {
	if c.off {
		return fmt.Errorf("fillerTier: %w", errors.ErrUnsupported)
	}
	c.mu.Lock()
	c.fills++
	c.mu.Unlock()
	m := ext.Meta()
	b := make([]byte, m.Size)
	if _, err := ext.File().ReadAt(b, ext.Offset()); err != nil {
		return err
	}
	if index.Checksum(b) != m.Sum {
		return fmt.Errorf("fillerTier: %v: %w", m.Key, tiers.ErrCorrupt)
	}
	return c.Tier.Put(m, b)
}

// fillerOverFiles stacks a fillerTier labelled HBM over a fileTier
// labelled SSD.
func fillerOverFiles(t *testing.T) (*tiers.Hierarchy, *fillerTier, *fileTier) {
	t.Helper()
	top, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	c, f := &fillerTier{Tier: top}, newFileTier(t)
	h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
		{Kind: index.TierHBM, Tier: c, HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: f, HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, c, f
}

// putBelow puts block i and demotes it into the file tier.
func putBelow(t *testing.T, h *tiers.Hierarchy, i int) []byte {
	t.Helper()
	b := put(t, h, i)
	if err := h.Demote(index.TierHBM, key(i)); err != nil {
		t.Fatal(err)
	}
	if w := where(t, h, i); w != index.TierSSD.String() {
		t.Fatalf("block %d is in %s after the demotion", i, w)
	}
	return b
}

// A block promoted out of a tier that keeps it in a file, into one that
// fills blocks from files, is read from the file by the upper tier: no Get
// below, no Put above; the extent is released.
func TestPromotionFromAFileLocatorFillsFromTheFile(t *testing.T) {
	h, c, f := fillerOverFiles(t)
	want := putBelow(t, h, 1)
	c.puts = 0
	// A hit below promotes (inline here) as the read returns.
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil || kind != index.TierSSD || !bytes.Equal(got, want) {
		t.Fatalf("the read: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
	}
	if c.fills != 1 || c.puts != 0 || f.gets != 1 {
		t.Fatalf("the promotion made %d fills and %d Puts, the file tier %d Gets; want 1, 0 and 1 (the read's)", c.fills, c.puts, f.gets)
	}
	if f.open != 0 {
		t.Fatalf("%d extents left unreleased", f.open)
	}
	got, _, kind, err = h.Get(key(1), nil)
	if err != nil || kind != index.TierHBM || !bytes.Equal(got, want) {
		t.Fatalf("after the promotion: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
	}
	if st := h.Stats(); st.Levels[0].Promotions != 1 {
		t.Fatalf("%d promotions counted, want 1", st.Levels[0].Promotions)
	}
}

// A block the lower tier does not keep in a file of its own, or a filler
// turned off, is promoted as before: Get below, Put above.
func TestPromotionFallsBackToGetAndPut(t *testing.T) {
	for _, tc := range []struct {
		name        string
		inline, off bool
	}{{"not in a file", true, false}, {"filler off", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			h, c, f := fillerOverFiles(t)
			want := putBelow(t, h, 1)
			f.inline, c.off, c.puts = tc.inline, tc.off, 0
			if ok, err := h.PromoteTo(index.TierHBM, key(1)); !ok || err != nil {
				t.Fatalf("PromoteTo: %v, %v", ok, err)
			}
			if c.fills != 0 || c.puts != 1 || f.gets != 1 || f.open != 0 {
				t.Fatalf("%d fills, %d Puts, %d Gets, %d extents open; want 0, 1, 1, 0", c.fills, c.puts, f.gets, f.open)
			}
			got, _, kind, err := h.Get(key(1), nil)
			if err != nil || kind != index.TierHBM || !bytes.Equal(got, want) {
				t.Fatalf("after the promotion: %v from %v, equal %v", err, kind, bytes.Equal(got, want))
			}
		})
	}
}

// A file whose bytes fail their checksum stores nothing above; the lower
// tier's Get then finds the copy corrupt and drops it, and the block is a
// miss, as it is when a corrupt block is read without files.
func TestACorruptFileIsNotPromotedAndIsAMiss(t *testing.T) {
	h, c, f := fillerOverFiles(t)
	putBelow(t, h, 1)
	putBelow(t, h, 2)
	fd, err := os.OpenFile(f.path(key(1)), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte{0x55, 0xaa}, fileHeader+100); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	if _, err := h.PromoteTo(index.TierHBM, key(1)); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("PromoteTo of a corrupt block: %v, want ErrCorrupt", err)
	}
	if c.fills != 1 || f.open != 0 {
		t.Fatalf("%d fills, %d extents open; want 1 and 0", c.fills, f.open)
	}
	if st := c.Stats(); st.Blocks != 0 || st.Used != 0 {
		t.Fatalf("the upper tier after the corrupt fill: %+v, want empty", st)
	}
	if _, _, _, err := h.Get(key(1), nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of the corrupt block: %v, want ErrNotFound", err)
	}
	if w := where(t, h, 1); w != "gone" {
		t.Fatalf("the corrupt block is recorded in %s", w)
	}
	// The other block is untouched, and promotes from its file.
	if ok, err := h.PromoteTo(index.TierHBM, key(2)); !ok || err != nil {
		t.Fatalf("PromoteTo of the sound block: %v, %v", ok, err)
	}
	if w := where(t, h, 2); w != index.TierHBM.String() {
		t.Fatalf("the sound block is in %s", w)
	}
}

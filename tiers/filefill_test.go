package tiers_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

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
func fillerOverFiles(t *testing.T) (*tiers.Hierarchy, *fillerTier, *tiertest.FileTier) {
	t.Helper()
	top, err := dram.New(dram.Config{Capacity: 8 * blockSize, MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	c, f := &fillerTier{Tier: top}, tiertest.NewFileTier(t, 64*blockSize, blockSize)
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
	if gets, open := f.Counts(); c.fills != 1 || c.puts != 0 || gets != 1 || open != 0 {
		t.Fatalf("the promotion made %d fills and %d Puts, the file tier %d Gets, %d extents left open; want 1, 0, 1 (the read's) and 0", c.fills, c.puts, gets, open)
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
			f.SetInline(tc.inline)
			c.off, c.puts = tc.off, 0
			if ok, err := h.PromoteTo(index.TierHBM, key(1)); !ok || err != nil {
				t.Fatalf("PromoteTo: %v, %v", ok, err)
			}
			if gets, open := f.Counts(); c.fills != 0 || c.puts != 1 || gets != 1 || open != 0 {
				t.Fatalf("%d fills, %d Puts, %d Gets, %d extents open; want 0, 1, 1, 0", c.fills, c.puts, gets, open)
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
	fd, err := os.OpenFile(f.Path(key(1)), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fd.WriteAt([]byte{0x55, 0xaa}, tiertest.FileHeader+100); err != nil {
		t.Fatal(err)
	}
	fd.Close()
	if _, err := h.PromoteTo(index.TierHBM, key(1)); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("PromoteTo of a corrupt block: %v, want ErrCorrupt", err)
	}
	if _, open := f.Counts(); c.fills != 1 || open != 0 {
		t.Fatalf("%d fills, %d extents open; want 1 and 0", c.fills, open)
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

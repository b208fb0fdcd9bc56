package tiers_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/policy"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

const blockSize = 4096

func newDRAM(t *testing.T, blocks int) tiers.Tier {
	t.Helper()
	tr, err := dram.New(dram.Config{Capacity: int64(blocks * blockSize), MaxBlockSize: blockSize})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// twoLevels stacks a DRAM tier of top blocks over a second tier of bottom
// blocks labelled SSD; both are arenas, so the test runs in memory.
func twoLevels(t *testing.T, top, bottom int, change func(*tiers.Config)) *tiers.Hierarchy {
	t.Helper()
	cfg := tiers.Config{
		Inline: true,
		Levels: []tiers.LevelConfig{
			{Kind: index.TierDRAM, Tier: newDRAM(t, top), HighWatermark: 1, LowWatermark: 1},
			{Kind: index.TierSSD, Tier: newDRAM(t, bottom), HighWatermark: 1, LowWatermark: 1},
		},
	}
	if change != nil {
		change(&cfg)
	}
	h, err := tiers.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func key(i int) index.Key { return index.Key{NS: 7, Hash: index.Hash(i)} }

func put(t *testing.T, h *tiers.Hierarchy, i int) []byte {
	t.Helper()
	m, b := tiertest.Block(index.Hash(i), blockSize)
	if err := h.Put(m, b); err != nil {
		t.Fatalf("put %d: %v", i, err)
	}
	return b
}

func where(t *testing.T, h *tiers.Hierarchy, i int) string {
	t.Helper()
	_, kind, err := h.Stat(key(i))
	if errors.Is(err, tiers.ErrNotFound) {
		return "gone"
	}
	if err != nil {
		t.Fatal(err)
	}
	return kind.String()
}

func TestPutLandsInDRAMAndGetReturnsIt(t *testing.T) {
	h := twoLevels(t, 4, 8, nil)
	want := put(t, h, 1)
	got, m, kind, err := h.Get(key(1), nil)
	if err != nil || !bytes.Equal(got, want) || kind != index.TierDRAM || m.Sum != index.Checksum(want) {
		t.Fatalf("Get = %v %v %v", kind, m, err)
	}
}

func TestFullDRAMDemotesLeastRecentToSSD(t *testing.T) {
	h := twoLevels(t, 4, 8, nil)
	for i := 1; i <= 6; i++ {
		put(t, h, i)
	}
	for i, want := range map[int]string{1: "ssd", 2: "ssd", 3: "dram", 6: "dram"} {
		if got := where(t, h, i); got != want {
			t.Errorf("block %d in %s, want %s", i, got, want)
		}
	}
	s := h.Stats()
	if s.Levels[0].Evictions != 2 || s.Levels[1].Demotions != 2 || s.Levels[0].Drops != 0 {
		t.Fatalf("stats %+v", s.Levels)
	}
}

func TestSSDVictimsAreDroppedAtTheBottom(t *testing.T) {
	h := twoLevels(t, 2, 2, nil)
	for i := 1; i <= 6; i++ {
		put(t, h, i)
	}
	if got := where(t, h, 1); got != "gone" {
		t.Fatalf("oldest block still in %s", got)
	}
	if s := h.Stats(); s.Levels[1].Drops != 2 {
		t.Fatalf("ssd drops = %d, want 2", s.Levels[1].Drops)
	}
}

func TestSSDHitIsServedAndPromoted(t *testing.T) {
	h := twoLevels(t, 2, 8, nil)
	want := put(t, h, 1)
	put(t, h, 2)
	put(t, h, 3) // demotes 1
	got, _, kind, err := h.Get(key(1), nil)
	if err != nil || kind != index.TierSSD || !bytes.Equal(got, want) {
		t.Fatalf("Get from ssd: %v %v", kind, err)
	}
	if where(t, h, 1) != "dram" {
		t.Fatal("hit was not promoted to dram")
	}
	// The SSD copy stays, so the next eviction of block 1 writes nothing.
	p := h.Lookup(7, []index.Hash{1})
	if p.At(index.Location{Node: 1, Tier: index.TierSSD}) != 1 || p.At(index.Location{Node: 1, Tier: index.TierDRAM}) != 1 {
		t.Fatalf("lookup after promotion: %+v", p)
	}
	if s := h.Stats(); s.Levels[0].Promotions != 1 || s.Levels[1].Hits != 1 {
		t.Fatalf("stats %+v", s.Levels)
	}
}

func TestNoPromoteLeavesHitsBelow(t *testing.T) {
	h := twoLevels(t, 2, 8, func(c *tiers.Config) { c.NoPromote = true })
	for i := 1; i <= 3; i++ {
		put(t, h, i)
	}
	_, _, _, _ = h.Get(key(1), nil)
	if where(t, h, 1) != "ssd" {
		t.Fatal("promoted though NoPromote is set")
	}
}

func TestAdmissionKeepsOneHitWondersOffSSD(t *testing.T) {
	h := twoLevels(t, 2, 8, func(c *tiers.Config) { c.Levels[1].AdmitMinSeen = 2 })
	put(t, h, 1)
	put(t, h, 2)
	_, _, _, _ = h.Get(key(2), nil) // block 2 is seen twice
	put(t, h, 3)                    // evicts 1: seen once, dropped
	put(t, h, 4)                    // evicts 2: seen twice, demoted
	if where(t, h, 1) != "gone" || where(t, h, 2) != "ssd" {
		t.Fatalf("block 1 in %s (want gone), block 2 in %s (want ssd)", where(t, h, 1), where(t, h, 2))
	}
}

func TestPinnedBlocksMayMoveDownButNeverOut(t *testing.T) {
	h := twoLevels(t, 2, 2, nil)
	put(t, h, 1)
	lease, err := h.Pin([]index.Key{key(1)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 10; i++ {
		put(t, h, i)
	}
	if where(t, h, 1) != "ssd" {
		t.Fatalf("pinned block in %s, want demoted to ssd and kept there", where(t, h, 1))
	}
	if err := h.Delete(key(1)); !errors.Is(err, tiers.ErrPinned) {
		t.Fatalf("Delete of a pinned block: %v", err)
	}
	lease.Release()
	for i := 11; i <= 14; i++ {
		put(t, h, i)
	}
	if where(t, h, 1) != "gone" {
		t.Fatal("released block never evicted")
	}
}

func TestPutFailsFullWhenEverythingIsPinned(t *testing.T) {
	h := twoLevels(t, 1, 1, nil)
	put(t, h, 1)
	put(t, h, 2) // 1 → ssd
	if _, err := h.Pin([]index.Key{key(1), key(2)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	m, b := tiertest.Block(3, blockSize)
	if err := h.Put(m, b); !errors.Is(err, tiers.ErrFull) {
		t.Fatalf("put with every block pinned: %v, want ErrFull", err)
	}
	if where(t, h, 3) != "gone" || where(t, h, 1) != "ssd" || where(t, h, 2) != "dram" {
		t.Fatal("failed put changed the cache")
	}
}

func TestExpiredPinsStopProtecting(t *testing.T) {
	h := twoLevels(t, 1, 1, nil)
	put(t, h, 1)
	if _, err := h.Pin([]index.Key{key(1)}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Millisecond)
	put(t, h, 2)
	if where(t, h, 1) != "ssd" {
		t.Fatalf("block under an expired lease in %s, want ssd", where(t, h, 1))
	}
}

func TestPutReplacesTheBlockInEveryLevel(t *testing.T) {
	h := twoLevels(t, 1, 4, nil)
	put(t, h, 1)
	put(t, h, 2) // 1 → ssd
	m, b := tiertest.Block(1, 100)
	if err := h.Put(m, b); err != nil {
		t.Fatal(err)
	}
	got, gm, _, err := h.Get(key(1), nil)
	if err != nil || !bytes.Equal(got, b) || gm.Size != 100 {
		t.Fatalf("Get after replace: %v", err)
	}
	p := h.Lookup(7, []index.Hash{1})
	if p.At(index.Location{Node: 1, Tier: index.TierSSD}) != 0 {
		t.Fatal("old version still listed in ssd")
	}
}

func TestDeleteFromOneTier(t *testing.T) {
	h := twoLevels(t, 1, 4, nil)
	put(t, h, 1)
	put(t, h, 2) // 1 → ssd
	_, _, _, _ = h.Get(key(1), nil)
	if err := h.DeleteFrom(index.TierSSD, key(1)); err != nil {
		t.Fatal(err)
	}
	if where(t, h, 1) != "dram" {
		t.Fatal("DeleteFrom ssd removed the dram copy")
	}
	if err := h.DeleteFrom(index.TierSSD, key(1)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("second DeleteFrom: %v", err)
	}
	if err := h.Delete(key(1)); err != nil || where(t, h, 1) != "gone" {
		t.Fatalf("Delete: %v", err)
	}
}

func TestPrefixPolicyKeepsChainsWhole(t *testing.T) {
	// Chain A (blocks 1-4) then chain B (11-14) into a DRAM of 6 blocks with
	// no level below. LRU gives up A's root first (touched first), which
	// leaves the rest of A useless; the prefix policy gives up A's tail and
	// keeps a usable prefix of A.
	for _, tc := range []struct {
		policy string
		prefix int
	}{{"lru", 0}, {"prefix", 2}} {
		pol, err := policy.New(tc.policy)
		if err != nil {
			t.Fatal(err)
		}
		h, err := tiers.New(tiers.Config{Inline: true, Levels: []tiers.LevelConfig{
			{Kind: index.TierDRAM, Tier: newDRAM(t, 6), Policy: pol, HighWatermark: 1, LowWatermark: 1},
		}})
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{1, 2, 3, 4, 11, 12, 13, 14} {
			put(t, h, i)
		}
		if got := h.Lookup(7, []index.Hash{1, 2, 3, 4}).Blocks; got != tc.prefix {
			t.Errorf("%s: chain A keeps %d leading blocks, want %d", tc.policy, got, tc.prefix)
		}
		if got := h.Lookup(7, []index.Hash{11, 12, 13, 14}).Blocks; got != 4 {
			t.Errorf("%s: chain B keeps %d leading blocks, want 4", tc.policy, got)
		}
		_ = h.Close()
	}
}

func TestBackgroundMoverHonoursWatermarks(t *testing.T) {
	h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 10), HighWatermark: 0.8, LowWatermark: 0.5},
		{Kind: index.TierSSD, Tier: newDRAM(t, 20)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i := 1; i <= 9; i++ { // 90 % > high watermark
		put(t, h, i)
	}
	deadline := time.Now().Add(5 * time.Second)
	for h.Stats().Levels[0].Used > 5*blockSize {
		if time.Now().After(deadline) {
			t.Fatalf("dram still at %d bytes, want ≤ low watermark", h.Stats().Levels[0].Used)
		}
		time.Sleep(time.Millisecond)
	}
	if s := h.Stats(); s.Levels[1].Blocks != 4 {
		t.Fatalf("ssd holds %d blocks, want the 4 demoted", s.Levels[1].Blocks)
	}
}

func TestConfigErrorsListEveryProblem(t *testing.T) {
	_, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, HighWatermark: 1.5},
		{Kind: index.TierDRAM, Tier: newDRAM(t, 1), LowWatermark: 0.99, HighWatermark: 0.9, AdmitMinSeen: 99},
	}})
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	for _, want := range []string{"level 0 (dram): no tier", "high watermark 1.5", "kind used twice", "low watermark 0.99", "admit-min-seen 99"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

func TestValidateReportsWhatEnsureDefaultsWouldFill(t *testing.T) {
	cfg := tiers.Config{Levels: []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: newDRAM(t, 1)}}}
	err := cfg.Validate()
	if !errors.Is(err, tiers.ErrInvalidConfig) {
		t.Fatalf("Validate of a config without defaults = %v", err)
	}
	for _, want := range []string{"node 0", "max lease", "no policy", "high watermark 0", "low watermark 0", "admit-min-seen 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate after EnsureDefaults = %v", err)
	}
}

// TestNewLeavesTheCallersLevelsAlone checks that the defaults New fills in
// (a policy, watermarks) go into its copy of the levels, not the caller's
// slice: a second hierarchy built from the same slice would otherwise share
// the first one's policy.
func TestNewLeavesTheCallersLevelsAlone(t *testing.T) {
	levels := []tiers.LevelConfig{{Kind: index.TierDRAM, Tier: newDRAM(t, 4)}}
	h1, err := tiers.New(tiers.Config{Inline: true, Levels: levels})
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Close()
	if l := levels[0]; l.Policy != nil || l.HighWatermark != 0 || l.LowWatermark != 0 || l.AdmitMinSeen != 0 {
		t.Fatalf("New changed the caller's level: %+v", l)
	}
}

// TestConcurrentUseKeepsDirectoryTrue hammers a small hierarchy with the
// background mover on, then checks that no read was torn and that a
// directory listening to the hierarchy's changes lists exactly what each
// tier holds.
func TestConcurrentUseKeepsDirectoryTrue(t *testing.T) {
	dramTier, ssdTier := newDRAM(t, 8), newDRAM(t, 16)
	dir := index.NewDirectory()
	h, err := tiers.New(tiers.Config{OnChange: dir.Apply, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: dramTier, HighWatermark: 0.75, LowWatermark: 0.5},
		{Kind: index.TierSSD, Tier: ssdTier},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			var buf []byte
			for range 2000 {
				i := 1 + r.IntN(40)
				switch op := r.IntN(10); {
				case op < 4:
					m, b := tiertest.Block(index.Hash(i), 512+r.IntN(blockSize-512))
					if err := h.Put(m, b); err != nil && !errors.Is(err, tiers.ErrFull) {
						t.Error(err)
					}
				case op < 9:
					got, m, _, err := h.Get(key(i), buf[:0])
					if err == nil && (index.Checksum(got) != m.Sum || m.Key != key(i)) {
						t.Errorf("torn read of %d", i)
					}
					if err != nil && !errors.Is(err, tiers.ErrNotFound) {
						t.Error(err)
					}
					buf = got
				default:
					_ = h.Delete(key(i))
				}
			}
		})
	}
	wg.Wait()
	h.Settle()
	defer h.Close()
	// Every copy a tier holds is in the directory at its tier, and the
	// directory lists nothing more.
	held := map[index.Location]int{}
	for _, l := range []struct {
		tr   tiers.Tier
		kind index.TierKind
	}{{dramTier, index.TierDRAM}, {ssdTier, index.TierSSD}} {
		loc := index.Location{Node: 1, Tier: l.kind}
		if err := l.tr.Scan(func(m index.Header) bool {
			e, ok := dir.Get(m.Key)
			if !ok || !slices.Contains(e.Locations, loc) {
				t.Errorf("%v holds %v, the directory does not say so", l.kind, m.Key)
			}
			held[loc]++
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	listed := map[index.Location]int{}
	dir.Range(func(_ index.Key, e index.Entry) bool {
		for _, l := range e.Locations {
			listed[l]++
		}
		return true
	})
	if fmt.Sprint(held) != fmt.Sprint(listed) {
		t.Fatalf("tiers hold %v, directory lists %v", held, listed)
	}
	if err := tiers.CheckReadIndex(h); err != nil {
		t.Fatal(err)
	}
	if s := h.Stats(); s.Levels[0].Used > s.Levels[0].Capacity*3/4 {
		t.Fatalf("dram above its high watermark after Settle: %+v", s.Levels[0])
	}
}

// TestLookupAgreesWithAListeningDirectory runs random puts, gets and
// deletes through three levels, the last one shared, and checks after each
// that the hierarchy's Lookup answers what a directory fed by its OnChange
// answers for the locations this node can read: its own and the shared
// level's (index.AnyNode). Another node's location in that directory is
// never counted.
func TestLookupAgreesWithAListeningDirectory(t *testing.T) {
	const node = 3
	dir := index.NewDirectory()
	other := index.Location{Node: node + 1, Tier: index.TierDRAM}
	readable := func(l index.Location) bool { return l.Node == node || l.Node == index.AnyNode }
	h, err := tiers.New(tiers.Config{Node: node, Inline: true, OnChange: dir.Apply, Levels: []tiers.LevelConfig{
		{Kind: index.TierDRAM, Tier: newDRAM(t, 4), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierSSD, Tier: newDRAM(t, 8), HighWatermark: 1, LowWatermark: 1},
		{Kind: index.TierS3, Tier: newDRAM(t, 16), Shared: true, HighWatermark: 1, LowWatermark: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	r := rand.New(rand.NewPCG(1, 2))
	chain := func(from, n int) []index.Hash {
		c := make([]index.Hash, n)
		for i := range c {
			c[i] = index.Hash(from + i)
		}
		return c
	}
	kinds := []index.TierKind{index.TierDRAM, index.TierSSD, index.TierS3}
	sawShared := false
	for step := range 2000 {
		i := 1 + r.IntN(24)
		switch op := r.IntN(10); {
		case op < 5:
			put(t, h, i)
		case op < 8:
			_, _, _, _ = h.Get(key(i), nil)
		case op < 9:
			_ = h.DeleteFrom(kinds[r.IntN(len(kinds))], key(i))
		default:
			_ = h.Delete(key(i))
		}
		if r.IntN(4) == 0 { // another node's copy, which this node cannot read
			dir.Add(key(i), index.Meta{Size: blockSize}, other)
		}
		for range 3 {
			from := 1 + r.IntN(24)
			c := chain(from, 1+r.IntN(25-from))
			got, want := h.Lookup(7, c), dir.Lookup(7, c, readable)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("step %d, chain from %d of %d: hierarchy says %+v, directory %+v", step, from, len(c), got, want)
			}
			sawShared = sawShared || got.At(index.Location{Node: index.AnyNode, Tier: index.TierS3}) > 0
		}
	}
	if !sawShared {
		t.Fatal("no lookup found a block in the shared level")
	}
}

func TestViewHandsOutDRAMBytesInPlace(t *testing.T) {
	h := twoLevels(t, 2, 8, nil)
	want := put(t, h, 1)
	v, kind, err := h.View(key(1), time.Minute)
	if err != nil || kind != index.TierDRAM || !bytes.Equal(v.Bytes(), want) {
		t.Fatalf("View: %v %v", kind, err)
	}
	if err := v.Release(); err != nil {
		t.Fatal(err)
	}
	put(t, h, 2)
	put(t, h, 3) // 1 → ssd
	v, kind, err = h.View(key(1), time.Minute)
	if err != nil || kind != index.TierSSD || !bytes.Equal(v.Bytes(), want) {
		t.Fatalf("View from ssd: %v %v", kind, err)
	}
	_ = v.Release()
}

func TestReserveCommitsLikePut(t *testing.T) {
	h := twoLevels(t, 2, 8, nil)
	put(t, h, 1)
	put(t, h, 2)
	m, b := tiertest.Block(3, blockSize)
	r, err := h.Reserve(m) // evicts block 1 to make room
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), b)
	if where(t, h, 3) != "gone" {
		t.Fatal("reserved block visible before Commit")
	}
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	got, _, kind, err := h.Get(key(3), nil)
	if err != nil || kind != index.TierDRAM || !bytes.Equal(got, b) {
		t.Fatalf("Get after Commit: %v %v", kind, err)
	}
	m4, _ := tiertest.Block(4, blockSize)
	r, err = h.Reserve(m4)
	if err != nil {
		t.Fatal(err)
	}
	r.Abort()
	// The room Reserve made stays made (its victim went to the ssd), but
	// nothing of block 4 is left.
	if where(t, h, 4) != "gone" || h.Stats().Levels[0].Used != blockSize || where(t, h, 2) != "ssd" {
		t.Fatalf("after Abort: block 4 %s, dram %+v", where(t, h, 4), h.Stats().Levels[0])
	}
	// The key is free again after Abort.
	put(t, h, 4)
}

func TestReserveTakesTheSumSetWhileFilling(t *testing.T) {
	h := twoLevels(t, 1, 8, nil)
	m, b := tiertest.Block(1, blockSize)
	sum := m.Sum
	m.Sum = 0 // not known until the bytes are in
	r, err := h.Reserve(m)
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Bytes(), b)
	r.SetSum(sum)
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	got, gm, kind, err := h.Get(key(1), nil)
	if err != nil || kind != index.TierDRAM || gm.Sum != sum || !bytes.Equal(got, b) {
		t.Fatalf("Get after Commit: %v sum %016x, want %016x: %v", kind, gm.Sum, sum, err)
	}
	put(t, h, 2) // 1 → ssd, with the Sum set
	got, gm, kind, err = h.Get(key(1), nil)
	if err != nil || kind != index.TierSSD || gm.Sum != sum || !bytes.Equal(got, b) {
		t.Fatalf("Get from the ssd: %v sum %016x, want %016x: %v", kind, gm.Sum, sum, err)
	}
}

// A new version of the same size over one in level 0 is what Get
// returns, and the directory hears of it again.
func TestRestoreOfTheSameMetaServesTheNewBytes(t *testing.T) {
	var stored []index.Change
	h := twoLevels(t, 4, 8, func(c *tiers.Config) {
		c.OnChange = func(ch index.Change) {
			if ch.Kind == index.ChangeStored {
				stored = append(stored, ch)
			}
		}
	})
	put(t, h, 1)
	m, b := tiertest.Block(1, blockSize)
	b[0] ^= 1 // new bytes, same size
	m.Sum = index.Checksum(b)
	if err := h.Put(m, b); err != nil {
		t.Fatal(err)
	}
	if got, gm, _, err := h.Get(key(1), nil); err != nil || gm.Sum != m.Sum || !bytes.Equal(got, b) {
		t.Fatalf("Get after the second Put: sum %016x, want %016x: %v", gm.Sum, m.Sum, err)
	}
	if len(stored) != 2 {
		t.Fatalf("%d stored changes for two versions, want 2: %+v", len(stored), stored)
	}
}

func TestBlocksSnapshotSelects(t *testing.T) {
	h := twoLevels(t, 2, 8, nil)
	for i := 1; i <= 3; i++ {
		put(t, h, i)
	}
	_, _ = h.Pin([]index.Key{key(3)}, time.Minute)
	inSSD := h.Blocks(func(b tiers.BlockInfo) bool { return slices.Contains(b.Kinds, index.TierSSD) })
	if len(inSSD) != 1 || inSSD[0].Key != key(1) {
		t.Fatalf("blocks in ssd: %+v", inSSD)
	}
	pinned := h.Blocks(func(b tiers.BlockInfo) bool { return b.Pinned })
	if len(pinned) != 1 || pinned[0].Key != key(3) || pinned[0].LastAccess.IsZero() {
		t.Fatalf("pinned blocks: %+v", pinned)
	}
}

func TestFrequencyAdmissionLetsOnlyAMoreFrequentVictimDisplaceAnSSDBlock(t *testing.T) {
	h := twoLevels(t, 2, 2, func(c *tiers.Config) { c.Levels[1].AdmitByFrequency = true })
	get := func(i, times int) {
		for range times {
			_, _, _, _ = h.Get(key(i), nil)
		}
	}
	put(t, h, 1)
	put(t, h, 2)
	get(1, 2) // 1 and 2 are seen three times each
	get(2, 2)
	put(t, h, 3) // evicts 1: the SSD has room, admitted
	put(t, h, 4) // evicts 2: admitted, the SSD is full
	put(t, h, 5) // evicts 3, seen once: not more often than the SSD's victim
	if where(t, h, 1) != "ssd" || where(t, h, 2) != "ssd" || where(t, h, 3) != "gone" {
		t.Fatalf("blocks 1, 2, 3 in %s, %s, %s; want ssd, ssd, gone", where(t, h, 1), where(t, h, 2), where(t, h, 3))
	}
	get(4, 4)    // 4 is seen five times
	put(t, h, 6) // evicts 5, seen once: dropped
	put(t, h, 7) // evicts 4: more frequent than the SSD's victim, admitted
	if where(t, h, 4) != "ssd" || where(t, h, 5) != "gone" {
		t.Fatalf("blocks 4, 5 in %s, %s; want ssd, gone", where(t, h, 4), where(t, h, 5))
	}
	if where(t, h, 1) != "gone" && where(t, h, 2) != "gone" {
		t.Fatal("block 4 entered a full SSD and neither 1 nor 2 left it")
	}
}

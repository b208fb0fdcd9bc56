package tiers_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/dram"
	"github.com/kvstrata/kvstrata/tiers/ssd"
)

// ssdLevels stacks a DRAM tier over a real SSD tier in dir that flushes
// only when told, so that a copy of dir is what a kill -9 would leave.
func ssdLevels(t *testing.T, dir string) (*tiers.Hierarchy, *ssd.Tier) {
	t.Helper()
	st, err := ssd.Open(ssd.Config{Dir: dir, Capacity: 1 << 30, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h, err := tiers.New(tiers.Config{
		Inline: true,
		Levels: []tiers.LevelConfig{
			{Kind: index.TierDRAM, Tier: newDRAM(t, 64)},
			{Kind: index.TierSSD, Tier: st},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, st
}

// crashCopy copies dir's files: the disk as a kill -9 now would leave it.
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "LOCK" || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// version is block i's bytes at version v.
func version(i, v int) (index.Header, []byte) {
	b := bytes.Repeat([]byte{byte(v)}, blockSize)
	b[0], b[1] = byte(i), byte(i>>8)
	m := index.Header{Key: key(i), Sum: index.Checksum(b)}
	m.Size = blockSize
	return m, b
}

// TestOverwriteOfADemotedBlockSurvivesACrash: v1 of each key is demoted
// to the SSD and flushed there; v2 is put; the node crashes before the
// SSD's next flush. After the restart no key may read v1 (v2 was lost
// with DRAM: it reads as missing). Keys whose SSD copy was evicted (a
// delete not yet durable) before v2 was put are covered too.
func TestOverwriteOfADemotedBlockSurvivesACrash(t *testing.T) {
	dir := t.TempDir()
	h, st := ssdLevels(t, dir)
	const n = 32
	for i := range n {
		m, b := version(i, 1)
		if err := h.Put(m, b); err != nil {
			t.Fatal(err)
		}
		if err := h.Demote(index.TierDRAM, key(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if i%4 == 0 {
			// Evicted from the SSD, then written again: the hierarchy no
			// longer knows of the SSD copy, whose delete is in memory only.
			if err := h.DeleteFrom(index.TierSSD, key(i)); err != nil {
				t.Fatal(err)
			}
		}
		m, b := version(i, 2)
		if err := h.Put(m, b); err != nil {
			t.Fatal(err)
		}
	}
	crashed := crashCopy(t, dir)

	after, _ := ssdLevels(t, crashed)
	for i := range n {
		got, _, _, err := after.Get(key(i), nil)
		switch {
		case errors.Is(err, tiers.ErrNotFound):
		case err != nil:
			t.Fatalf("key %d: %v", i, err)
		default:
			_, v1 := version(i, 1)
			if bytes.Equal(got, v1) {
				t.Errorf("key %d reads v1 after the crash; v2 was acknowledged", i)
			} else {
				t.Errorf("key %d reads bytes it was never given", i)
			}
		}
	}
}

// TestPutsOfNewKeysLogNoInvalidation: only a Put that replaces a key with
// an older copy below pays for a durable invalidation.
func TestPutsOfNewKeysLogNoInvalidation(t *testing.T) {
	dir := t.TempDir()
	h, _ := ssdLevels(t, dir)
	for i := range 200 { // over DRAM's 64 blocks: most are demoted
		m, b := version(i, 1)
		if err := h.Put(m, b); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kvstrata-invalidated-") {
			t.Fatalf("puts of new keys wrote the invalidation log %s", e.Name())
		}
	}
	// Overwriting a demoted key does.
	m, b := version(0, 2)
	if err := h.Put(m, b); err != nil {
		t.Fatal(err)
	}
	logged := false
	ents, _ = os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kvstrata-invalidated-") {
			f, err := os.Open(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, f)
			f.Close()
			logged = n > 0
		}
	}
	if !logged {
		t.Fatal("the overwrite of a demoted key logged no invalidation")
	}
}

// TestPutOfTheSameBytesKeepsTheCopyBelow: a block put again with the bytes
// the SSD holds for it (a KV block of a shared prefix, stored by a second
// engine) is no overwrite: the SSD copy stays, nothing is invalidated,
// and evicting the DRAM copy later writes nothing. Other bytes still
// replace it, durably.
func TestPutOfTheSameBytesKeepsTheCopyBelow(t *testing.T) {
	dir := t.TempDir()
	h, st := ssdLevels(t, dir)
	m, b := version(0, 1)
	if err := h.Put(m, b); err != nil {
		t.Fatal(err)
	}
	if err := h.Demote(index.TierDRAM, key(0)); err != nil {
		t.Fatal(err)
	}
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	demoted := h.Stats().Levels[1].Demotions

	if err := h.Put(m, bytes.Clone(b)); err != nil {
		t.Fatal(err)
	}
	if logged := invalidationLogBytes(t, dir); logged != 0 {
		t.Fatalf("a put of the bytes the SSD holds logged %d bytes of invalidation", logged)
	}
	if _, err := st.Stat(key(0)); err != nil {
		t.Fatalf("the SSD copy of the same bytes is gone: %v", err)
	}
	if err := h.Demote(index.TierDRAM, key(0)); err != nil {
		t.Fatal(err)
	}
	if got := h.Stats().Levels[1].Demotions; got != demoted {
		t.Errorf("moving the DRAM copy out demoted it to the SSD again (%d demotions, was %d), which held it already", got, demoted)
	}
	if got, _, kind, err := h.Get(key(0), nil); err != nil || kind != index.TierSSD || !bytes.Equal(got, b) {
		t.Fatalf("after the DRAM copy left: %v from %v, equal %t", err, kind, bytes.Equal(got, b))
	}

	m2, b2 := version(0, 2)
	if err := h.Put(m2, b2); err != nil {
		t.Fatal(err)
	}
	if invalidationLogBytes(t, dir) == 0 {
		t.Fatal("the put of other bytes logged no invalidation of the SSD copy")
	}
	if _, err := st.Stat(key(0)); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("the SSD still holds the older copy: %v", err)
	}
	after, _ := ssdLevels(t, crashCopy(t, dir))
	if got, _, _, err := after.Get(key(0), nil); err == nil {
		t.Fatalf("after a crash the key reads %d bytes of an older version (v1 %t)", len(got), bytes.Equal(got, b))
	}
}

// invalidationLogBytes is how many bytes the SSD tier in dir has in its
// invalidation logs.
func invalidationLogBytes(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kvstrata-invalidated-") {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			n += fi.Size()
		}
	}
	return n
}

// BenchmarkPutOverSSD measures Puts into a DRAM tier over a real SSD tier,
// from 16 goroutines a core: of new keys, of keys held in DRAM only, and
// of keys whose older version was demoted to the SSD (each such Put waits
// for a durable invalidation; concurrent ones share the sync). Run it with
// a fixed count, e.g. -benchtime=4000x: each op needs a key of its own.
// DRAM holds twice that, so that the mover demotes nothing meanwhile.
func BenchmarkPutOverSSD(b *testing.B) {
	for _, c := range []struct {
		name  string
		setup func(h *tiers.Hierarchy, n int)
	}{
		{"new-key", func(*tiers.Hierarchy, int) {}},
		{"overwrite-in-dram", func(h *tiers.Hierarchy, n int) { putAll(b, h, n, 1, false) }},
		{"overwrite-of-ssd-copy", func(h *tiers.Hierarchy, n int) { putAll(b, h, n, 1, true) }},
		{"same-bytes-as-ssd-copy", func(h *tiers.Hierarchy, n int) { putAll(b, h, n, 2, true) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			st, err := ssd.Open(ssd.Config{Dir: b.TempDir(), Capacity: 4 << 30})
			if err != nil {
				b.Fatal(err)
			}
			top, err := dram.New(dram.Config{Capacity: int64(2*b.N+64) * blockSize, MaxBlockSize: blockSize})
			if err != nil {
				b.Fatal(err)
			}
			h, err := tiers.New(tiers.Config{Levels: []tiers.LevelConfig{
				{Kind: index.TierDRAM, Tier: top}, {Kind: index.TierSSD, Tier: st}}})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			c.setup(h, b.N)
			var next atomic.Int64
			b.SetBytes(blockSize)
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := int(next.Add(1) - 1)
					m, v := version(i, 2)
					if err := h.Put(m, v); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// putAll puts version v of keys 0 to n-1, demoted to the SSD when demote
// is set.
func putAll(b *testing.B, h *tiers.Hierarchy, n, v int, demote bool) {
	for i := range n {
		m, v := version(i, v)
		if err := h.Put(m, v); err != nil {
			b.Fatal(err)
		}
		if demote {
			if err := h.Demote(index.TierDRAM, m.Key); err != nil {
				b.Fatal(err)
			}
		}
	}
	h.Settle()
}

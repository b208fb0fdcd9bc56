package ssd

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// These tests damage stored blocks by writing to Pebble behind the tier's
// back, then check that the damage is reported as tiers.ErrCorrupt, never
// returned as bytes, and that the damaged block is dropped with exact
// accounting. The conformance suite flips a byte of a payload
// (tiertest.Factory.Corrupt); the tests here damage payloads in the ways
// only a key-value store can (a value cut short, grown or gone) and the
// records that describe the blocks.

// setRaw overwrites a Pebble key of tr, or deletes it when v is nil. The
// record of a block key is also dropped from the records kept in memory,
// as it would be once pushed out of them (recordcache.go): the damage is
// then met by the next read.
func setRaw(t testing.TB, tr *Tier, key []byte, v []byte) {
	t.Helper()
	if k, err := parseKey(key[0], key); err == nil {
		s := tr.stripe(k)
		s.Lock()
		tr.recs.forget(k)
		s.Unlock()
	}
	if v == nil {
		must(t, tr.db.Delete(key, pebble.NoSync))
		return
	}
	must(t, tr.db.Set(key, v, pebble.NoSync))
}

// getRaw reads a Pebble key of tr.
func getRaw(t testing.TB, tr *Tier, key []byte) []byte {
	t.Helper()
	v, closer, err := tr.db.Get(key)
	must(t, err)
	defer closer.Close()
	return slices.Clone(v)
}

// putBlocks puts blocks 1..n of 5000 bytes and returns their metas.
func putBlocks(t *testing.T, tr *Tier, n int) []index.Header {
	t.Helper()
	var ms []index.Header
	for i := 1; i <= n; i++ {
		m, b := tiertest.Block(index.Hash(i), 5000)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
	}
	return ms
}

// checkDropped checks that m's block is gone and the others remain.
func checkDropped(t *testing.T, tr *Tier, m index.Header, others []index.Header) {
	t.Helper()
	if _, _, err := tr.Get(m.Key, nil); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Get of a dropped block: %v, want ErrNotFound", err)
	}
	if _, err := tr.Stat(m.Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat of a dropped block: %v, want ErrNotFound", err)
	}
	for _, o := range others {
		if o.Key == m.Key {
			continue
		}
		got, gm, err := tr.Get(o.Key, nil)
		if err != nil || gm != o || index.Checksum(got) != o.Sum {
			t.Fatalf("block %v next to the damaged one: %+v, %v", o.Key, gm, err)
		}
	}
	checkAccounting(t, tr)
	if s := tr.Stats(); s.Blocks != int64(len(others)-1) {
		t.Fatalf("after the drop: %+v, want %d blocks", s, len(others)-1)
	}
}

func TestCorruptPayloadIsDroppedAndNeverReturned(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"Truncated": func(v []byte) []byte { return v[:len(v)-1] },
		"Extended":  func(v []byte) []byte { return append(v, 0) },
		"Missing":   func([]byte) []byte { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 20})
			ms := putBlocks(t, tr, 3)
			m := ms[1]
			pk := makeKey(prefixPayload, m.Key)
			setRaw(t, tr, pk[:], damage(getRaw(t, tr, pk[:])))

			// Stat reads only the record, which is intact.
			if sm, err := tr.Stat(m.Key); err != nil || sm != m {
				t.Fatalf("Stat: %+v, %v", sm, err)
			}
			got, gm, err := tr.Get(m.Key, []byte("dst"))
			if !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("Get: %v, want ErrCorrupt", err)
			}
			if got != nil || gm != (index.Header{}) {
				t.Fatalf("Get returned %d bytes and %+v with its error", len(got), gm)
			}
			checkDropped(t, tr, m, ms)
		})
	}
}

func TestCorruptRecordIsDropped(t *testing.T) {
	flip := func(v []byte) []byte { v[10] ^= 1; return v }
	for name, c := range map[string]struct {
		damage func(tr *Tier, m index.Header) []byte // the record's new value
		find   func(tr *Tier, m index.Header) error  // how the tier meets it
	}{
		"FlippedBitSeenByStat": {
			damage: func(tr *Tier, m index.Header) []byte { return flip(recordOf(t, tr, m)) },
			find:   func(tr *Tier, m index.Header) error { _, err := tr.Stat(m.Key); return err },
		},
		"TruncatedSeenByGet": {
			damage: func(tr *Tier, m index.Header) []byte { return recordOf(t, tr, m)[:recordSize-1] },
			find:   func(tr *Tier, m index.Header) error { _, _, err := tr.Get(m.Key, nil); return err },
		},
		"OtherKeysRecordSeenByGet": {
			damage: func(tr *Tier, m index.Header) []byte {
				other := m
				other.Key.Hash++
				return recordOf(t, tr, other)
			},
			find: func(tr *Tier, m index.Header) error { _, _, err := tr.Get(m.Key, nil); return err },
		},
		"FlippedBitSeenByScan": {
			damage: func(tr *Tier, m index.Header) []byte { return flip(recordOf(t, tr, m)) },
			find: func(tr *Tier, m index.Header) error {
				n := 0
				must(t, tr.Scan(func(index.Header) bool { n++; return true }))
				if n != 2 {
					t.Fatalf("Scan saw %d blocks, want the 2 intact ones", n)
				}
				return tiers.ErrCorrupt
			},
		},
		"FlippedBitSeenByOpen": {
			damage: func(tr *Tier, m index.Header) []byte { return flip(recordOf(t, tr, m)) },
			find:   func(tr *Tier, m index.Header) error { return tiers.ErrCorrupt },
		},
	} {
		t.Run(name, func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 20})
			ms := putBlocks(t, tr, 3)
			m := ms[0]
			rk := makeKey(prefixRecord, m.Key)
			setRaw(t, tr, rk[:], c.damage(tr, m))
			if name == "FlippedBitSeenByOpen" {
				tr = reopen(t, tr)
			}
			if err := c.find(tr, m); !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("meeting the damaged record: %v, want ErrCorrupt", err)
			}
			checkDropped(t, tr, m, ms)
			if pk := makeKey(prefixPayload, m.Key); hasRaw(t, tr, pk[:]) {
				t.Fatal("payload of the dropped block is still stored")
			}
		})
	}
}

func TestPutAndDeleteOverCorruptRecord(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 20})
	ms := putBlocks(t, tr, 3)
	garble := func(m index.Header) {
		rk := makeKey(prefixRecord, m.Key)
		setRaw(t, tr, rk[:], bytes.Repeat([]byte{0xee}, recordSize))
	}
	garble(ms[0])
	m, b := tiertest.Block(ms[0].Key.Hash, 700)
	must(t, tr.Put(m, b))
	if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m || !bytes.Equal(got, b) {
		t.Fatalf("Get after a Put over a corrupt record: %+v, %v", gm, err)
	}
	garble(ms[1])
	if err := tr.Delete(ms[1].Key); err != nil {
		t.Fatalf("Delete of a block with a corrupt record: %v", err)
	}
	if _, err := tr.Stat(ms[1].Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat after Delete: %v, want ErrNotFound", err)
	}
	checkAccounting(t, tr)
	if s := tr.Stats(); s.Blocks != 2 || s.Used != cost(700)+cost(5000) {
		t.Fatalf("stats %+v", s)
	}
}

// recordOf returns the stored record of m's key, or a valid record for m
// when none is stored.
func recordOf(t *testing.T, tr *Tier, m index.Header) []byte {
	rk := makeKey(prefixRecord, m.Key)
	if hasRaw(t, tr, rk[:]) {
		return getRaw(t, tr, rk[:])
	}
	return encodeRecord(nil, m, 0)
}

func hasRaw(t *testing.T, tr *Tier, key []byte) bool {
	t.Helper()
	_, closer, err := tr.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false
	}
	must(t, err)
	_ = closer.Close()
	return true
}

// blockFilePath returns the path of key's block file, or "" for a block
// kept inline.
func blockFilePath(t testing.TB, tr *Tier, key index.Key) string {
	t.Helper()
	_, gen, err := tr.record(key)
	must(t, err)
	if gen == 0 {
		return ""
	}
	return tr.files.path(key, gen)
}

// flipFileByte flips one bit of the middle byte of a file.
func flipFileByte(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	b[len(b)/2] ^= 0x10
	must(t, os.WriteFile(path, b, 0o644))
}

// A block file that is missing, short or damaged makes its block corrupt:
// Get reports tiers.ErrCorrupt and returns no bytes, the block is dropped
// with exact accounting, and its file is gone after the next flush.
func TestCorruptBlockFileIsDroppedAndNeverReturned(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, path string){
		"Missing":   func(t *testing.T, path string) { must(t, os.Remove(path)) },
		"Truncated": func(t *testing.T, path string) { must(t, os.Truncate(path, 100<<10-1)) },
		"Empty":     func(t *testing.T, path string) { must(t, os.Truncate(path, 0)) },
		"Flipped":   func(t *testing.T, path string) { flipFileByte(t, path) },
	} {
		t.Run(name, func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 30})
			var ms []index.Header
			for i := 1; i <= 3; i++ {
				m, b := tiertest.Block(index.Hash(i), 100<<10)
				must(t, tr.Put(m, b))
				ms = append(ms, m)
			}
			must(t, tr.Flush())
			m := ms[1]
			path := blockFilePath(t, tr, m.Key)
			if path == "" {
				t.Fatal("a block of 100 KiB is kept inline")
			}
			damage(t, path)
			if sm, err := tr.Stat(m.Key); err != nil || sm != m {
				t.Fatalf("Stat: %+v, %v", sm, err)
			}
			got, gm, err := tr.Get(m.Key, []byte("dst"))
			if !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("Get: %v, want ErrCorrupt", err)
			}
			if got != nil || gm != (index.Header{}) {
				t.Fatalf("Get returned %d bytes and %+v with its error", len(got), gm)
			}
			checkDropped(t, tr, m, ms)
			must(t, tr.Flush())
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the file of the dropped block after a flush: %v, want it removed", err)
			}
			tr = reopen(t, tr)
			checkDropped(t, tr, m, ms)
			checkBlockFiles(t, tr)
		})
	}
}

// GetMany and LocateFile meet a missing block file as Get does.
func TestMissingBlockFileSeenByGetManyAndLocateFile(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30})
	var ms []index.Header
	for i := 1; i <= 3; i++ {
		m, b := tiertest.Block(index.Hash(i), 100<<10)
		must(t, tr.Put(m, b))
		ms = append(ms, m)
	}
	must(t, os.Remove(blockFilePath(t, tr, ms[0].Key)))
	must(t, os.Remove(blockFilePath(t, tr, ms[1].Key)))
	must(t, tr.GetManyPooled(context.Background(), []index.Key{ms[0].Key}, func(_ int, v []byte, ref *bufpool.Buffer, _ index.Header, err error) {
		if !errors.Is(err, tiers.ErrCorrupt) || v != nil || ref != nil {
			t.Errorf("GetManyPooled of a block whose file is missing: %d bytes, %v; want ErrCorrupt", len(v), err)
		}
	}))
	if _, err := tr.LocateFile(ms[1].Key); !errors.Is(err, tiers.ErrCorrupt) {
		t.Fatalf("LocateFile of a block whose file is missing: %v, want ErrCorrupt", err)
	}
	checkDropped(t, tr, ms[1], ms[1:])
	if _, err := tr.Stat(ms[0].Key); !errors.Is(err, tiers.ErrNotFound) {
		t.Fatalf("Stat of the dropped block: %v", err)
	}
}

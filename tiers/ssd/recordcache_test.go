package ssd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// testNS is the namespace of tiertest.Block's keys.
const testNS index.NamespaceID = 7

func TestRecordSlotSize(t *testing.T) {
	if got := unsafe.Sizeof(recordSlot{}); got != recordSlotSize {
		t.Fatalf("a slot takes %d bytes, recordSlotSize says %d", got, recordSlotSize)
	}
	if got := unsafe.Sizeof(recordPart{}); got != 64 {
		t.Fatalf("a part takes %d bytes, want a cache line of 64", got)
	}
	c := newRecordCache(DefaultRecordCache)
	n := 0
	for i := range c.parts {
		n += len(c.parts[i].slots)
	}
	if n != DefaultRecordCache {
		t.Fatalf("the default table has %d slots, want %d", n, DefaultRecordCache)
	}
}

// versioned is version v of key h's block, of size bytes: v in its first
// 8 bytes, the rest as tiertest.Block makes them.
func versioned(h index.Hash, v uint64, size int) (index.Header, []byte) {
	m, b := tiertest.Block(h, size)
	binary.LittleEndian.PutUint64(b, v)
	m.Sum = index.Checksum(b)
	return m, b
}

// getVersion reads key's block and returns its version, checking the
// bytes against the Header Get returns.
func getVersion(t *testing.T, tr *Tier, key index.Key) (uint64, error) {
	t.Helper()
	b, m, err := tr.Get(key, nil)
	if err != nil {
		return 0, err
	}
	if m.Key != key || int(m.Size) != len(b) || index.Checksum(b) != m.Sum {
		t.Fatalf("Get %v: %d bytes that do not match the Header %+v", key, len(b), m)
	}
	return binary.LittleEndian.Uint64(b), nil
}

// A record kept in memory follows every change of its block: a Put that
// replaces it (inline and in a file, each way), a Delete, an Invalidate,
// and the drop of a block found corrupt. The old blocks' files stay on
// disk until the next flush, so a stale record would read the old bytes,
// which pass their own checksum: only the version tells.
func TestRecordsInMemoryAreNeverStale(t *testing.T) {
	for _, records := range []int{DefaultRecordCache, stripeCount, -1} {
		t.Run(fmt.Sprintf("records=%d", records), func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 30, RecordCache: records, FlushInterval: 1 << 40})
			const h = 77
			key := index.Key{NS: testNS, Hash: h}
			want := func(v uint64) {
				t.Helper()
				for range 2 { // the second from memory, where kept
					got, err := getVersion(t, tr, key)
					if err != nil || got != v {
						t.Fatalf("Get: version %d, %v; want version %d", got, err, v)
					}
				}
				if records > 0 {
					m, _, ok := tr.recs.get(key)
					if !ok || m.Key != key {
						t.Fatalf("the record of a block just read is not kept: %+v, %v", m, ok)
					}
				}
			}
			wantNone := func(what string) {
				t.Helper()
				if _, err := getVersion(t, tr, key); !errors.Is(err, tiers.ErrNotFound) {
					t.Fatalf("Get after %s: %v, want ErrNotFound", what, err)
				}
				if _, err := tr.Stat(key); !errors.Is(err, tiers.ErrNotFound) {
					t.Fatalf("Stat after %s: %v, want ErrNotFound", what, err)
				}
				if _, _, ok := tr.recs.get(key); ok {
					t.Fatalf("a record is kept after %s", what)
				}
			}
			v := uint64(0)
			put := func(size int) {
				t.Helper()
				v++
				m, b := versioned(h, v, size)
				must(t, tr.Put(m, b))
			}
			const file, inline = 80 << 10, 5000
			put(file)
			want(1)
			put(file + 1) // a new file
			want(2)
			put(inline) // inline, the file doomed
			want(3)
			put(inline + 1) // inline over inline
			want(4)
			put(file) // a file over inline
			want(5)
			must(t, tr.Delete(key))
			wantNone("Delete")
			put(file)
			want(6)
			must(t, tr.Invalidate(key))
			wantNone("Invalidate")
			put(inline)
			want(7)
			must(t, tr.Invalidate(key))
			wantNone("Invalidate of an inline block")
			put(file)
			want(8)
			flipFileByte(t, blockFilePath(t, tr, key))
			if _, err := getVersion(t, tr, key); !errors.Is(err, tiers.ErrCorrupt) {
				t.Fatalf("Get of a damaged block file: %v, want ErrCorrupt", err)
			}
			wantNone("the drop of a corrupt block")
			put(file)
			want(9)
			checkAccounting(t, tr)
		})
	}
}

// A record kept in memory is not read from Pebble again: a damaged
// record on disk goes unseen by reads while the good one is kept, and the
// block's bytes are still checked against it. The damage is met by a
// Scan, which reads the records from Pebble, or at the next Open, and the
// block is dropped.
func TestRecordInMemoryOutlivesDamageOnDisk(t *testing.T) {
	for _, meet := range []string{"Scan", "Open"} {
		t.Run(meet, func(t *testing.T) {
			tr := openTest(t, Config{Capacity: 1 << 30})
			ms := putBlocks(t, tr, 3)
			m := ms[0]
			rk := makeKey(prefixRecord, m.Key)
			must(t, tr.db.Set(rk[:], bytes.Repeat([]byte{0xee}, recordSize), pebble.NoSync)) // behind the tier's back
			if got, gm, err := tr.Get(m.Key, nil); err != nil || gm != m || index.Checksum(got) != m.Sum {
				t.Fatalf("Get with the record kept in memory: %+v, %v", gm, err)
			}
			if meet == "Scan" {
				n := 0
				must(t, tr.Scan(func(index.Header) bool { n++; return true }))
				if n != 2 {
					t.Fatalf("Scan saw %d blocks, want the 2 intact ones", n)
				}
			} else {
				tr = reopen(t, tr) // which drops the record that fails its checks
			}
			checkDropped(t, tr, m, ms)
		})
	}
}

// Readers and writers of keys that share slots (a table of one slot per
// stripe) never see an older block than the last one put before the read
// began.
func TestRecordsInMemoryUnderConcurrentPuts(t *testing.T) {
	tr := openTest(t, Config{Capacity: 1 << 30, RecordCache: stripeCount, FlushInterval: 5_000_000})
	const keys, versions = 8, 40
	var acked [keys]atomic.Uint64
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() { // the writer of key k
			defer wg.Done()
			for v := uint64(1); v <= versions; v++ {
				size := 5000 // inline and in files, in turn
				if v%2 == 0 {
					size = 70 << 10
				}
				m, b := versioned(index.Hash(k+1), v, size+k)
				if err := tr.Put(m, b); err != nil {
					t.Error(err)
					return
				}
				acked[k].Store(v)
			}
		}()
	}
	for r := range 4 {
		wg.Add(1)
		go func() { // a reader of every key
			defer wg.Done()
			for i := range keys * versions {
				k := (i + r) % keys
				before := acked[k].Load()
				b, m, err := tr.Get(index.Key{NS: testNS, Hash: index.Hash(k + 1)}, nil)
				switch {
				case errors.Is(err, tiers.ErrNotFound) && before == 0:
					continue
				case err != nil:
					t.Errorf("Get of key %d: %v", k, err)
					return
				case index.Checksum(b) != m.Sum:
					t.Errorf("Get of key %d: bytes and Header disagree", k)
					return
				}
				if got := binary.LittleEndian.Uint64(b); got < before {
					t.Errorf("Get of key %d: version %d, after version %d was put", k, got, before)
					return
				}
			}
		}()
	}
	wg.Wait()
	checkAccounting(t, tr)
}

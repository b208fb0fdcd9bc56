package ssd

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// This file holds the tier's reads and writes of Pebble keys. Callers hold
// t.life shared (or are Open) and, where a method says so, the key's
// stripe.

// record reads and checks key's metadata record, and returns the number
// of the block's file (zero for a block kept inline). It fails with
// tiers.ErrNotFound when there is none and with an error wrapping
// tiers.ErrCorrupt when the record fails its checks. A record kept in
// memory (recordcache.go) is returned from there, and one read from
// Pebble is kept. The caller holds key's stripe, shared or exclusively,
// or is Open.
func (t *Tier) record(key index.Key) (index.Header, uint64, error) {
	if m, gen, ok := t.recs.get(key); ok {
		return m, gen, nil
	}
	rk := makeKey(prefixRecord, key)
	v, closer, err := get(t.db, rk[:])
	if err != nil {
		return index.Header{}, 0, readError("record", err)
	}
	defer closer.Close()
	m, gen, err := decodeRecordFor(key, v)
	if err != nil {
		return index.Header{}, 0, fmt.Errorf("record: %w", err)
	}
	t.recs.put(m, gen)
	return m, gen, nil
}

// payload reads the bytes of the inline block that m describes and checks
// them against m's size and checksum. A missing or damaged payload fails
// with an error wrapping tiers.ErrCorrupt. The bytes are valid until the
// closer is closed.
func (t *Tier) payload(m index.Header) ([]byte, io.Closer, error) {
	pk := makeKey(prefixPayload, m.Key)
	v, closer, err := get(t.db, pk[:])
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil, fmt.Errorf("payload: %w: missing", tiers.ErrCorrupt)
	}
	if err != nil {
		return nil, nil, readError("payload", err)
	}
	if len(v) != int(m.Size) {
		_ = closer.Close()
		return nil, nil, fmt.Errorf("payload: %w: %d bytes, record says %d", tiers.ErrCorrupt, len(v), m.Size)
	}
	if sum := index.Checksum(v); sum != m.Sum {
		_ = closer.Close()
		return nil, nil, fmt.Errorf("payload: %w: checksum %016x, record says %016x", tiers.ErrCorrupt, sum, m.Sum)
	}
	return v, closer, nil
}

// get is db.Get that reports a failed read of a value Pebble keeps in a
// blob file (a block's bytes): Pebble's DB.Get returns such a value as
// empty, with no error, and keeps the error for the closer (v2.1.7 reads
// the value with Iterator.Value, which drops it).
func get(db *pebble.DB, key []byte) ([]byte, io.Closer, error) {
	v, closer, err := db.Get(key)
	if err != nil {
		return nil, nil, err
	}
	if it, ok := closer.(interface{ Error() error }); ok {
		if err := it.Error(); err != nil {
			_ = closer.Close()
			return nil, nil, err
		}
	}
	return v, closer, nil
}

// readError maps an error of Pebble's reading what onto the tiers errors.
func readError(what string, err error) error {
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return tiers.ErrNotFound
	case pebble.IsCorruptionError(err):
		// Pebble marks its corruption errors (a block whose checksum
		// fails, say) with cockroachdb/errors, which the standard
		// library's errors.Is does not see.
		return fmt.Errorf("%s: %w: %w", what, tiers.ErrCorrupt, err)
	}
	return fmt.Errorf("read %s: %w", what, err)
}

// deleteKeys deletes key's record and payload in one batch, and queues
// the removal of its block file gen (zero for none) of size bytes. The
// caller holds key's stripe exclusively and fixes the accounting.
func (t *Tier) deleteKeys(key index.Key, gen uint64, size uint32) error {
	if err := t.commitDelete(key, false); err != nil {
		return err
	}
	if gen != 0 {
		t.files.doom(key, gen, int64(size))
	}
	t.dirty.Store(true)
	t.markDeleted(key)
	return nil
}

// checkFormat checks the store's format marker, writing it into an empty
// store.
func (t *Tier) checkFormat() error {
	v, closer, err := get(t.db, formatKey)
	if err == nil {
		got := string(v)
		_ = closer.Close()
		switch got {
		case string(formatVersion):
			return nil
		case string(formatVersion1):
			// Its records read as inline blocks; mark it format 2 before
			// a block file is written, so that an older build refuses it.
			if err := t.db.Set(formatKey, formatVersion, pebble.NoSync); err != nil {
				return fmt.Errorf("write format marker: %w", err)
			}
			if err := t.flushWait(); err != nil {
				return fmt.Errorf("write format marker: %w", err)
			}
			t.cfg.Logger.Info("ssd: took over a store of format 1; its blocks stay inline until replaced",
				"dir", t.cfg.Dir)
			return nil
		}
		return fmt.Errorf("store format %q, this build reads %q and %q: a store written by a newer build; remove the directory to start empty",
			got, formatVersion1, formatVersion)
	}
	if !errors.Is(err, pebble.ErrNotFound) {
		return fmt.Errorf("read format marker: %w", err)
	}
	it, err := t.db.NewIter(nil)
	if err != nil {
		return err
	}
	empty := !it.First()
	if err := it.Close(); err != nil {
		return err
	}
	if !empty {
		return errors.New("the Pebble store in it is not an ssd tier (no format marker)")
	}
	if err := t.db.Set(formatKey, formatVersion, pebble.NoSync); err != nil {
		return fmt.Errorf("write format marker: %w", err)
	}
	// Without a WAL only a flush makes the marker durable; on a full file
	// system it fails rather than waits.
	return t.flushWait()
}

// scanEntry is one record a scan read: a block's Meta, or why its record
// is corrupt.
type scanEntry struct {
	raw    []byte // the record's Pebble key, valid during the callback
	key    index.Key
	badKey bool // raw is no record key; key is zero
	meta   index.Header
	gen    uint64 // the block's file, zero when inline
	err    error  // wraps tiers.ErrCorrupt
}

// eachRecord calls fn for each metadata record, in key order, from key
// from on (the first record when from is nil), until fn returns false. It
// returns the key of the record fn returned false for, nil at the end.
func (t *Tier) eachRecord(from []byte, fn func(e *scanEntry) bool) (next []byte, err error) {
	lower, upper := prefixBounds(prefixRecord)
	if from != nil {
		lower = from
	}
	it, err := t.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, fmt.Errorf("scan records: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		e := scanEntry{raw: it.Key()}
		e.key, e.err = parseKey(prefixRecord, e.raw)
		e.badKey = e.err != nil
		if !e.badKey {
			var v []byte
			if v, e.err = it.ValueAndErr(); e.err != nil {
				e.err = readError("record", e.err)
				if !errors.Is(e.err, tiers.ErrCorrupt) {
					_ = it.Close()
					return nil, e.err
				}
			} else {
				e.meta, e.gen, e.err = decodeRecordFor(e.key, v)
			}
		}
		if !fn(&e) {
			next = slices.Clone(e.raw)
			break
		}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("scan records: %w", err)
	}
	return next, nil
}

// scanPage is the number of records Scan reads per iterator.
const scanPage = 256

// Scan calls fn with the Header of each block, in key order, until fn
// returns false. It reads the records a page at a time and calls fn with
// no lock held; blocks put or deleted during a Scan may or may not be
// seen. Corrupt records it meets are dropped and skipped.
func (t *Tier) Scan(fn func(index.Header) bool) error {
	var from []byte
	for {
		t.life.RLock()
		if t.closed {
			t.life.RUnlock()
			return fmt.Errorf("ssd: scan: %w", tiers.ErrClosed)
		}
		page := make([]scanEntry, 0, scanPage)
		next, err := t.eachRecord(from, func(e *scanEntry) bool {
			if len(page) == scanPage {
				return false
			}
			e.raw = nil
			page = append(page, *e)
			return true
		})
		t.life.RUnlock()
		if err != nil {
			return fmt.Errorf("ssd: scan: %w", err)
		}
		for _, e := range page {
			if e.err != nil {
				t.life.RLock()
				switch {
				case t.closed:
				case e.badKey:
					// Only a recount deletes a record by its raw key.
					if err := t.recount(); err != nil {
						t.cfg.Logger.Error("ssd: scan", "dir", t.cfg.Dir, "err", err)
					}
				default:
					t.dropIfCorrupt(e.key, e.err)
				}
				t.life.RUnlock()
				continue
			}
			if !fn(e.meta) {
				return nil
			}
		}
		if next == nil {
			return nil
		}
		from = next
	}
}

// loop samples the file system's free space and the store's disk usage
// every FlushInterval and, in DurabilityFlush mode, flushes the memtable
// when anything was written since the last flush (in DurabilityWAL mode
// it syncs the block files and, for removed blocks, the WAL: settleFiles),
// until t.stop closes. A
// flush that cannot complete (the file system is full; Pebble retries it)
// is not joined by another: each would queue one more memtable. It does
// not take t.life: Close stops it before it closes the store.
func (t *Tier) loop() {
	defer close(t.done)
	tick := time.NewTicker(t.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		t.space.sample(t.diskUsage())
		if t.cfg.Durability != DurabilityFlush {
			if err := t.settleFiles(); err != nil {
				t.cfg.Logger.Error("ssd: background sync of block files", "dir", t.cfg.Dir, "err", err)
			}
			continue
		}
		if t.flushPending() {
			continue
		}
		if !t.dirty.Swap(false) {
			continue
		}
		if err := t.flushLocked(); err != nil {
			t.dirty.Store(true)
			t.cfg.Logger.Error("ssd: background flush", "dir", t.cfg.Dir, "err", err)
		}
	}
}

package ssd

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// accounting is the tier's Used and Blocks. Put reserves before its batch
// commits and releases on failure, so that two Puts of different keys
// cannot both take the last free bytes.
type accounting struct {
	mu       sync.Mutex
	capacity int64
	used     int64
	blocks   int64
}

// reserve adds bytes and blocks, or fails with tiers.ErrFull when bytes > 0
// would take Used over capacity.
func (a *accounting) reserve(bytes, blocks int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if bytes > 0 && a.used+bytes > a.capacity {
		return fmt.Errorf("%w: %s of %s used, the block needs %s more", tiers.ErrFull,
			units.FormatBytes(a.used), units.FormatBytes(a.capacity), units.FormatBytes(bytes))
	}
	a.used += bytes
	a.blocks += blocks
	return nil
}

// fits reports whether bytes more would keep Used within capacity now.
func (a *accounting) fits(bytes int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.used+bytes <= a.capacity
}

// release undoes a reserve, or accounts for a deleted block.
func (a *accounting) release(bytes, blocks int64) {
	a.mu.Lock()
	a.used -= bytes
	a.blocks -= blocks
	a.mu.Unlock()
}

func (a *accounting) set(used, blocks int64) {
	a.mu.Lock()
	a.used, a.blocks = used, blocks
	a.mu.Unlock()
}

func (a *accounting) stats() tiers.Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return tiers.Stats{Capacity: a.capacity, Used: a.used, Blocks: a.blocks}
}

// load rebuilds the accounting from the metadata records, deleting every
// record that fails its checks together with its payload, and empties the
// records kept in memory. It runs in Open and, with every stripe held, in
// recount.
func (t *Tier) load() error {
	t.recs.clear()
	var used, blocks int64
	var bad []scanEntry
	_, err := t.eachRecord(nil, func(e *scanEntry) bool {
		if e.err == nil {
			used += cost(e.meta.Size)
			blocks++
			t.files.noteGen(e.gen)
		} else {
			e.raw = slices.Clone(e.raw)
			bad = append(bad, *e)
		}
		return true
	})
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		b := t.db.NewBatch()
		defer b.Close()
		for _, e := range bad {
			t.cfg.Logger.Warn("ssd: dropping block with a corrupt record", "dir", t.cfg.Dir,
				"key", fmt.Sprintf("%x", e.raw), "err", e.err)
			if err := b.Delete(e.raw, nil); err != nil {
				return err
			}
			if !e.badKey {
				pk := makeKey(prefixPayload, e.key)
				if err := b.Delete(pk[:], nil); err != nil {
					return err
				}
			}
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return fmt.Errorf("delete corrupt records: %w", err)
		}
		t.dirty.Store(true)
	}
	t.acct.set(used, blocks)
	return nil
}

// recount rebuilds the accounting from the records, holding every stripe
// so that no Put or Delete runs meanwhile. It is the way back to exact
// numbers after a record was found corrupt, whose block's size is then
// unknown. The caller holds t.life shared and no stripe.
func (t *Tier) recount() error {
	for i := range t.stripes {
		t.stripes[i].Lock()
	}
	defer func() {
		for i := range t.stripes {
			t.stripes[i].Unlock()
		}
	}()
	if err := t.load(); err != nil {
		return fmt.Errorf("recount: %w", err)
	}
	return nil
}

// dropIfCorrupt drops key's block when err says that it is corrupt, and
// logs the drop. The caller holds t.life shared and no stripe.
func (t *Tier) dropIfCorrupt(key index.Key, err error) {
	if !errors.Is(err, tiers.ErrCorrupt) {
		return
	}
	t.cfg.Logger.Warn("ssd: dropping corrupt block", "dir", t.cfg.Dir, "key", key, "err", err)
	if err := t.drop(key); err != nil {
		t.cfg.Logger.Error("ssd: drop corrupt block", "dir", t.cfg.Dir, "key", key, "err", err)
	}
}

// drop deletes key's block if, checked again under the key's lock, it is
// still corrupt: a Put may have replaced it since a reader found it bad.
// The record is read again from Pebble, not from memory, where a good copy
// may outlive damage on disk (recordcache.go). A block with a good record
// is released at the record's cost; one with a corrupt record, whose cost
// is unknown, is followed by a recount. The caller holds t.life shared and
// no stripe.
func (t *Tier) drop(key index.Key) error {
	s := t.stripe(key)
	s.Lock()
	t.recs.forget(key)
	m, gen, err := t.record(key)
	if errors.Is(err, tiers.ErrCorrupt) {
		// Its file, if any, is unknown: the next Open removes it.
		err := t.deleteKeys(key, 0, 0)
		s.Unlock()
		if err != nil {
			return err
		}
		return t.recount()
	}
	defer s.Unlock()
	if errors.Is(err, tiers.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if gen != 0 {
		err = t.files.read(m, gen, make([]byte, m.Size))
	} else {
		var closer io.Closer
		if _, closer, err = t.payload(m); err == nil {
			_ = closer.Close()
		}
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, tiers.ErrCorrupt) {
		return err
	}
	if err := t.deleteKeys(key, gen, m.Size); err != nil {
		return err
	}
	t.acct.release(cost(m.Size), 1)
	return nil
}

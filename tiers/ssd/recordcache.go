package ssd

import (
	"sync"

	"github.com/kvstrata/kvstrata/index"
)

// # Records kept in memory
//
// Every read of a block starts with its metadata record: the block's size,
// checksum and file. Reading it from Pebble (DB.Get, which sets up an
// iterator over the memtables and the sstables that may hold the key)
// costs about as much CPU as the pread of a 64 KiB block from the page
// cache. The tier therefore keeps the records it read or wrote lately in
// a table in memory, of Config.RecordCache slots of recordSlotSize bytes
// each, allocated at Open: the only memory it takes, whatever the number
// of blocks stored. The slots are split among the key locks' stripes, and
// a key has one slot among its stripe's, chosen by its hash; a record
// takes the slot from whichever record held it.
//
// The table is never stale, because every slot is changed only under its
// key's stripe lock:
//
//   - A writer of a record — Put, Delete, Invalidate, the drop of a corrupt
//     block — holds the key's stripe exclusively while it commits, and
//     puts the new record into the key's slot, or forgets the key's record
//     (commitDelete, and a write that fails).
//   - A reader holds the stripe shared and puts into the slot the record it
//     has just read from Pebble and checked, which no writer can change
//     before the reader lets go of the stripe.
//   - recount, which deletes corrupt records by their Pebble keys with
//     every stripe held, empties the table (load).
//
// The table holds only records that passed their checks, as written or
// read. A record damaged on disk after it was put in the table is not seen
// by reads while it stays there: they go on checking the block's bytes
// against the record the tier wrote, so damaged bytes are still never
// returned. The damage is met by a Scan, which reads the records from
// Pebble, and the drop that follows reads the record from Pebble again
// (drop); otherwise once the record leaves the table, or at the next Open,
// which checks every record. After a crash the table is empty, like the
// rest of the tier's memory.

// recordSlot is one slot of the table: a block's record, decoded, 48 bytes.
type recordSlot struct {
	key    index.Key
	parent index.Hash
	sum    uint64
	gen    uint64 // the block's file, zero when inline
	size   uint32
	flags  uint8 // slotUsed, slotHasParent
}

const (
	slotUsed = 1 << iota
	slotHasParent
)

// recordSlotSize is the size in bytes of a slot of the table.
const recordSlotSize = 48

// recordCache is the table of records kept in memory, one part per key
// stripe. Its methods are called with the key's stripe held (see above);
// each part's own mutex orders the readers of one stripe, which hold it
// shared.
type recordCache struct {
	parts [stripeCount]recordPart
}

type recordPart struct {
	mu    sync.Mutex
	slots []recordSlot
	_     [64 - 8 - 24]byte // a part to a cache line: readers of other stripes do not share it
}

// newRecordCache returns a table of about n slots, none for n ≤ 0.
func newRecordCache(n int) *recordCache {
	c := &recordCache{}
	if n <= 0 {
		return c
	}
	per := (n + stripeCount - 1) / stripeCount
	all := make([]recordSlot, per*stripeCount)
	for i := range c.parts {
		c.parts[i].slots = all[i*per : (i+1)*per : (i+1)*per]
	}
	return c
}

// slot returns the part and the slot index of key.
func (c *recordCache) slot(key index.Key) (*recordPart, int) {
	h := stripeHash(key)
	p := &c.parts[h%stripeCount]
	// Multiply-shift over the hash's bits, then a range reduction: keys of
	// one stripe share h's low bits.
	mixed := (h * 0x9e3779b97f4a7c15) >> 32
	return p, int(mixed * uint64(len(p.slots)) >> 32)
}

// get returns key's record, if the table holds it.
func (c *recordCache) get(key index.Key) (index.Header, uint64, bool) {
	p, i := c.slot(key)
	if len(p.slots) == 0 {
		return index.Header{}, 0, false
	}
	p.mu.Lock()
	s := p.slots[i]
	p.mu.Unlock()
	if s.flags&slotUsed == 0 || s.key != key {
		return index.Header{}, 0, false
	}
	var m index.Header
	m.Key = s.key
	m.Size = s.size
	m.Sum = s.sum
	m.HasParent = s.flags&slotHasParent != 0
	m.Parent = s.parent
	return m, s.gen, true
}

// put puts m's record, whose block is in file gen (zero: inline), into
// its key's slot. The caller holds the key's stripe, and m is the record
// Pebble holds for the key.
func (c *recordCache) put(m index.Header, gen uint64) {
	p, i := c.slot(m.Key)
	if len(p.slots) == 0 {
		return
	}
	s := recordSlot{key: m.Key, parent: m.Parent, sum: m.Sum, gen: gen, size: m.Size, flags: slotUsed}
	if m.HasParent {
		s.flags |= slotHasParent
	}
	p.mu.Lock()
	p.slots[i] = s
	p.mu.Unlock()
}

// forget drops key's record from the table, if it holds it. The caller
// holds the key's stripe exclusively.
func (c *recordCache) forget(key index.Key) {
	p, i := c.slot(key)
	if len(p.slots) == 0 {
		return
	}
	p.mu.Lock()
	if p.slots[i].key == key {
		p.slots[i] = recordSlot{}
	}
	p.mu.Unlock()
}

// clear empties the table. The caller holds every stripe exclusively, or
// is Open.
func (c *recordCache) clear() {
	for i := range c.parts {
		p := &c.parts[i]
		p.mu.Lock()
		clear(p.slots)
		p.mu.Unlock()
	}
}

// held returns how many records the table holds, for tests.
func (c *recordCache) held() int {
	n := 0
	for i := range c.parts {
		p := &c.parts[i]
		p.mu.Lock()
		for _, s := range p.slots {
			if s.flags&slotUsed != 0 {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

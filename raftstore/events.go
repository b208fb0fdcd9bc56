package raftstore

import (
	"encoding/binary"
	"fmt"

	"github.com/kvstrata/kvstrata/index"
)

// Event is one change to the directory that a node reports about its own
// tiers. It is index.Change, so that a decoded batch goes to
// index.Directory.ApplyBatch as it is.
type Event = index.Change

// The kinds of Event.
const (
	// EventStored: Loc holds Key now, with metadata Meta.
	EventStored = index.ChangeStored
	// EventRemoved: Loc no longer holds Key. Meta is not sent.
	EventRemoved = index.ChangeRemoved
	// EventNodeDropped: forget every location of node Loc.Node. Key, Meta
	// and Loc.Tier are not sent.
	EventNodeDropped = index.ChangeNodeDropped
)

// The bits of an event's header byte in an EntryEvents entry. The fields
// an event does not carry are those of the event before it (for the first
// event: zero), which in a batch of one node's blocks of one namespace,
// stored chain by chain, makes most stored events 9 bytes: the header and
// the block hash.
const (
	evKindMask  = 0x03 // the event's kind, 1 to 3
	evNS        = 0x04 // the namespace follows: 8 bytes little-endian
	evLoc       = 0x08 // the location follows: uvarint node, tier byte
	evHasParent = 0x10 // Meta.HasParent
	evParent    = 0x20 // the parent follows: 8 bytes; else it is the previous event's hash
	evSize      = 0x40 // Meta.Size follows: uvarint; else the previous stored event's
	evReserved  = 0x80 // must be 0
	hashSize    = 8
)

// EventBatch encodes events into the data of one EntryEvents raft entry.
// Append events, Encode, then Reset to start the next batch. An EventBatch
// is not safe for concurrent use.
//
// The encoding, after the type byte EntryEvents:
//
//	uvarint count
//	count × event: header byte (the ev bits above), then
//	  stored:       [ns 8] [node uvarint, tier 1] hash 8 [parent 8] [size uvarint]
//	  removed:      [ns 8] [node uvarint, tier 1] hash 8
//	  node-dropped:        [node uvarint, tier 1]
//
// Fields in brackets are present only when their header bit says so.
type EventBatch struct {
	body []byte // the encoded events
	n    int
	prev prevFields
}

// prevFields are the fields an event inherits from the events before it.
type prevFields struct {
	ns   index.NamespaceID
	loc  index.Location
	hash index.Hash
	size uint32
}

// Len returns the number of events appended since the last Reset.
func (b *EventBatch) Len() int { return b.n }

// Size returns the length the encoding has so far, a few bytes short of
// what Encode returns.
func (b *EventBatch) Size() int { return len(b.body) }

// Reset empties the batch and keeps its memory.
func (b *EventBatch) Reset() {
	b.body = b.body[:0]
	b.n = 0
	b.prev = prevFields{}
}

// Append adds ev to the batch. It panics on an event of an unknown kind.
func (b *EventBatch) Append(ev Event) {
	if ev.Kind < EventStored || ev.Kind > EventNodeDropped {
		panic(fmt.Sprintf("raftstore: EventBatch.Append: unknown event kind %d", ev.Kind))
	}
	p := &b.prev
	if ev.Kind == EventNodeDropped {
		// Only the node is sent: keep the tier the next event inherits.
		ev.Loc.Tier = p.loc.Tier
	}
	h := byte(ev.Kind)
	if ev.Loc != p.loc {
		h |= evLoc
	}
	if ev.Kind != EventNodeDropped && ev.Key.NS != p.ns {
		h |= evNS
	}
	if ev.Kind == EventStored {
		if ev.Meta.HasParent {
			h |= evHasParent
			if ev.Meta.Parent != p.hash {
				h |= evParent
			}
		} else if ev.Meta.Parent != 0 {
			// A parent without HasParent means nothing; it is not sent.
			ev.Meta.Parent = 0
		}
		if ev.Meta.Size != p.size {
			h |= evSize
		}
	}
	buf := append(b.body, h)
	if h&evNS != 0 {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(ev.Key.NS))
		p.ns = ev.Key.NS
	}
	if h&evLoc != 0 {
		buf = binary.AppendUvarint(buf, uint64(ev.Loc.Node))
		buf = append(buf, byte(ev.Loc.Tier))
		p.loc = ev.Loc
	}
	if ev.Kind != EventNodeDropped {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(ev.Key.Hash))
		p.hash = ev.Key.Hash
	}
	if h&evParent != 0 {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(ev.Meta.Parent))
	}
	if h&evSize != 0 {
		buf = binary.AppendUvarint(buf, uint64(ev.Meta.Size))
		p.size = ev.Meta.Size
	}
	b.body = buf
	b.n++
}

// Encode returns the raft entry data of the batch: a new slice, which the
// caller owns; the batch is unchanged.
func (b *EventBatch) Encode() []byte {
	out := make([]byte, 0, 1+binary.MaxVarintLen64+len(b.body))
	out = append(out, byte(EntryEvents))
	out = binary.AppendUvarint(out, uint64(b.n))
	return append(out, b.body...)
}

// DecodeEvents decodes the data of an EntryEvents entry, appending its
// events to dst. Removed events come back with a zero Meta and node-dropped
// events with only Loc.Node set, whatever was appended. An error wraps
// ErrBadEntry.
func DecodeEvents(dst []Event, data []byte) ([]Event, error) {
	if len(data) == 0 || EntryType(data[0]) != EntryEvents {
		return dst, fmt.Errorf("%w: not an event batch", ErrBadEntry)
	}
	data = data[1:]
	count, n := binary.Uvarint(data)
	if n <= 0 {
		return dst, fmt.Errorf("%w: event batch: bad count", ErrBadEntry)
	}
	data = data[n:]
	// Every event takes at least one byte: a count beyond that is damage,
	// and must not make us allocate.
	if count > uint64(len(data)) {
		return dst, fmt.Errorf("%w: event batch: %d events in %d bytes", ErrBadEntry, count, len(data))
	}
	dst = growEvents(dst, int(count))
	var p prevFields
	for i := range int(count) {
		var ev Event
		var err error
		ev, data, err = decodeEvent(data, &p)
		if err != nil {
			return dst, fmt.Errorf("%w: event %d of %d: %w", ErrBadEntry, i, count, err)
		}
		dst = append(dst, ev)
	}
	if len(data) != 0 {
		return dst, fmt.Errorf("%w: event batch: %d bytes after the last event", ErrBadEntry, len(data))
	}
	return dst, nil
}

// growEvents returns dst with room for n more events.
func growEvents(dst []Event, n int) []Event {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]Event, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

// decodeEvent decodes the event at the start of data.
func decodeEvent(data []byte, p *prevFields) (Event, []byte, error) {
	var ev Event
	if len(data) == 0 {
		return ev, nil, fmt.Errorf("truncated")
	}
	h := data[0]
	data = data[1:]
	ev.Kind = index.ChangeKind(h & evKindMask)
	switch {
	case ev.Kind == 0:
		return ev, nil, fmt.Errorf("header %#02x: no kind", h)
	case h&evReserved != 0:
		return ev, nil, fmt.Errorf("header %#02x: reserved bit set", h)
	case ev.Kind != EventStored && h&(evHasParent|evParent|evSize) != 0,
		ev.Kind == EventNodeDropped && h&evNS != 0,
		h&evParent != 0 && h&evHasParent == 0:
		return ev, nil, fmt.Errorf("header %#02x: bits that kind %d does not have", h, ev.Kind)
	}
	if h&evNS != 0 {
		if len(data) < 8 {
			return ev, nil, fmt.Errorf("truncated namespace")
		}
		p.ns = index.NamespaceID(binary.LittleEndian.Uint64(data))
		data = data[8:]
	}
	if h&evLoc != 0 {
		node, n := binary.Uvarint(data)
		if n <= 0 || node > 1<<32-1 || len(data) < n+1 {
			return ev, nil, fmt.Errorf("truncated or bad location")
		}
		p.loc = index.Location{Node: index.NodeID(node), Tier: index.TierKind(data[n])}
		data = data[n+1:]
	}
	if ev.Kind == EventNodeDropped {
		ev.Loc.Node = p.loc.Node
		return ev, data, nil
	}
	ev.Loc = p.loc
	if len(data) < hashSize {
		return ev, nil, fmt.Errorf("truncated hash")
	}
	parent := p.hash
	ev.Key = index.Key{NS: p.ns, Hash: index.Hash(binary.LittleEndian.Uint64(data))}
	p.hash = ev.Key.Hash
	data = data[hashSize:]
	if ev.Kind == EventRemoved {
		return ev, data, nil
	}
	if h&evHasParent != 0 {
		ev.Meta.HasParent = true
		ev.Meta.Parent = parent
		if h&evParent != 0 {
			if len(data) < 8 {
				return ev, nil, fmt.Errorf("truncated parent")
			}
			ev.Meta.Parent = index.Hash(binary.LittleEndian.Uint64(data))
			data = data[8:]
		}
	}
	if h&evSize != 0 {
		size, n := binary.Uvarint(data)
		if n <= 0 || size > 1<<32-1 {
			return ev, nil, fmt.Errorf("truncated or bad size")
		}
		p.size = uint32(size)
		data = data[n:]
	}
	ev.Meta.Size = p.size
	return ev, data, nil
}

package index

import (
	"fmt"
	"maps"
	"slices"
	"sync"
)

// TierKind is a storage level.
type TierKind uint8

// The storage levels, fastest first.
const (
	TierHBM TierKind = iota + 1
	TierDRAM
	TierSSD
	TierS3
)

var tierNames = [...]string{TierHBM: "hbm", TierDRAM: "dram", TierSSD: "ssd", TierS3: "s3"}

func (t TierKind) String() string {
	if int(t) < len(tierNames) && tierNames[t] != "" {
		return tierNames[t]
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ParseTierKind is the inverse of TierKind.String.
func ParseTierKind(s string) (TierKind, error) {
	for i, n := range tierNames {
		if n != "" && n == s {
			return TierKind(i), nil
		}
	}
	return 0, fmt.Errorf("index: unknown tier %q (want hbm, dram, ssd or s3)", s)
}

// NodeID identifies a cache node within a cluster. AnyNode stands for
// cluster-wide storage (S3) that every node can read.
type NodeID uint32

// AnyNode is the node of cluster-wide locations.
const AnyNode NodeID = 0

// Location is where one copy of a block lives.
type Location struct {
	Node NodeID
	Tier TierKind
}

func (l Location) String() string {
	if l.Node == AnyNode {
		return l.Tier.String()
	}
	return fmt.Sprintf("node%d/%s", l.Node, l.Tier)
}

// Meta is what the directory keeps about a block besides its locations.
type Meta struct {
	Parent    Hash // hash of the previous block of the chain, if HasParent
	HasParent bool // false for the first block of a chain (or unknown)
	Size      uint32
}

// Entry is a snapshot of one directory record.
type Entry struct {
	Meta
	Locations []Location
}

// LocationBlocks says how many leading blocks of a chain one location holds.
type LocationBlocks struct {
	Location Location
	Blocks   int
}

// Prefix answers a longest-prefix lookup.
type Prefix struct {
	// Blocks is the number of leading blocks that some location holds: the
	// lookup stops at the first block held nowhere.
	Blocks int
	// ByLocation lists, for every location holding the first block, how
	// many leading blocks it holds on its own; most blocks first.
	ByLocation []LocationBlocks
}

// At returns how many leading blocks location loc holds.
func (p Prefix) At(loc Location) int {
	for _, lb := range p.ByLocation {
		if lb.Location == loc {
			return lb.Blocks
		}
	}
	return 0
}

const shardCount = 64

// Directory maps block keys to their metadata and locations. All methods are
// safe for concurrent use; a Lookup sees each block atomically but not the
// whole chain as of one instant (a block removed mid-lookup may or may not be
// counted), which is the staleness any reader of a cache must accept anyway.
//
// Entries are immutable once stored (a change stores a new one), and a
// shard's map is copied on the first write after a Snapshot, so a snapshot
// costs one pass over 64 shard headers however large the directory is.
type Directory struct {
	shards [shardCount]dirShard
}

type dirShard struct {
	mu     sync.RWMutex
	m      map[Key]*Entry
	frozen bool // m is shared with a snapshot: copy it before writing
}

// writable returns the shard's map, copied first if a snapshot shares it.
// The caller holds s.mu for writing.
func (s *dirShard) writable() map[Key]*Entry {
	if s.frozen {
		s.m = maps.Clone(s.m)
		s.frozen = false
	}
	return s.m
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	d := &Directory{}
	for i := range d.shards {
		d.shards[i].m = make(map[Key]*Entry)
	}
	return d
}

func (d *Directory) shard(k Key) *dirShard {
	return &d.shards[d.shardIndex(k)]
}

// shardIndex returns the number of k's shard.
func (d *Directory) shardIndex(k Key) int {
	// The low bits of an xxhash are uniform; mixing in the namespace keeps
	// engine-supplied sequential ids spread too.
	return int((uint64(k.Hash) ^ uint64(k.NS) ^ uint64(k.Hash)>>32) % shardCount)
}

// Add records that loc holds key and sets its metadata.
func (d *Directory) Add(key Key, meta Meta, loc Location) {
	s := d.shard(key)
	s.mu.Lock()
	s.add(key, meta, loc)
	s.mu.Unlock()
}

// Remove records that loc no longer holds key and reports whether it did. A
// key held nowhere is forgotten.
func (d *Directory) Remove(key Key, loc Location) bool {
	s := d.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.remove(key, loc)
}

// add is Add within the shard; the caller holds s.mu for writing. An entry
// that would not change is left alone, so that its map is not copied.
func (s *dirShard) add(key Key, meta Meta, loc Location) {
	old := s.m[key]
	var locs []Location
	if old != nil {
		if old.Meta == meta && slices.Contains(old.Locations, loc) {
			return
		}
		locs = old.Locations
	}
	if !slices.Contains(locs, loc) {
		s.writable()[key] = newEntry(meta, locs, loc)
	} else {
		s.writable()[key] = newEntry(meta, locs)
	}
}

// remove is Remove within the shard; the caller holds s.mu for writing.
func (s *dirShard) remove(key Key, loc Location) bool {
	e := s.m[key]
	if e == nil {
		return false
	}
	i := slices.Index(e.Locations, loc)
	if i < 0 {
		return false
	}
	m := s.writable()
	if len(e.Locations) == 1 {
		delete(m, key)
		return true
	}
	m[key] = &Entry{Meta: e.Meta, Locations: slices.Delete(slices.Clone(e.Locations), i, i+1)}
	return true
}

// entryBox holds an entry together with room for its locations, so that a
// block held in one or two places costs one allocation instead of two.
type entryBox struct {
	e    Entry
	locs [2]Location
}

// newEntry returns a new entry of meta located at locs followed by more.
func newEntry(meta Meta, locs []Location, more ...Location) *Entry {
	n := len(locs) + len(more)
	if n > len(entryBox{}.locs) {
		l := make([]Location, 0, n)
		return &Entry{Meta: meta, Locations: append(append(l, locs...), more...)}
	}
	b := &entryBox{e: Entry{Meta: meta}}
	copy(b.locs[copy(b.locs[:], locs):], more)
	// Cap the slice at its length: an append to it must never write into
	// the box of an entry that readers share.
	b.e.Locations = b.locs[:n:n]
	return &b.e
}

// DropNode removes every location of node and returns how many it removed.
func (d *Directory) DropNode(node NodeID) int {
	n := 0
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		m := s.writable()
		for k, e := range m {
			if !slices.ContainsFunc(e.Locations, func(l Location) bool { return l.Node == node }) {
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(e.Locations), func(l Location) bool { return l.Node == node })
			n += len(e.Locations) - len(kept)
			if len(kept) == 0 {
				delete(m, k)
			} else {
				m[k] = &Entry{Meta: e.Meta, Locations: kept}
			}
		}
		s.mu.Unlock()
	}
	return n
}

// ChangeKind says what a Change does.
type ChangeKind uint8

// The kinds of Change.
const (
	// ChangeStored records that Loc holds Key, with metadata Meta (Add).
	ChangeStored ChangeKind = iota + 1
	// ChangeRemoved records that Loc no longer holds Key (Remove); Meta is
	// unused.
	ChangeRemoved
	// ChangeNodeDropped removes every location of node Loc.Node (DropNode);
	// Key, Meta and Loc.Tier are unused.
	ChangeNodeDropped
)

// Change is one mutation of a directory, as ApplyBatch takes them.
type Change struct {
	Kind ChangeKind
	Key  Key
	Meta Meta
	Loc  Location
}

// ApplyBatch applies changes in order: the directory ends up as if Add,
// Remove and DropNode had been called for each in turn. Changes of
// different keys commute, so between node drops it groups them by shard,
// keeping the order within each key, and takes each shard's lock once. A
// reader sees each block atomically, as with single calls, but may see a
// shard's part of the batch before another's. ApplyBatch panics, before
// changing anything, on a change of an unknown kind.
func (d *Directory) ApplyBatch(changes []Change) {
	for i, c := range changes {
		if c.Kind < ChangeStored || c.Kind > ChangeNodeDropped {
			panic(fmt.Sprintf("index: ApplyBatch: change %d has unknown kind %d", i, c.Kind))
		}
	}
	for len(changes) > 0 {
		i := slices.IndexFunc(changes, func(c Change) bool { return c.Kind == ChangeNodeDropped })
		if i < 0 {
			d.applyByShard(changes)
			return
		}
		d.applyByShard(changes[:i])
		d.DropNode(changes[i].Loc.Node)
		changes = changes[i+1:]
	}
}

// applyByShard applies stored and removed changes, one lock per shard.
func (d *Directory) applyByShard(changes []Change) {
	if len(changes) < shardCount/4 {
		// Too few to be worth sorting.
		for _, c := range changes {
			d.applyOne(d.shard(c.Key), c)
		}
		return
	}
	// A counting sort of the changes by shard, stable so that the changes
	// of one key stay in order.
	var start [shardCount + 1]int32
	shardOf := make([]uint8, len(changes))
	for i := range changes {
		si := d.shardIndex(changes[i].Key)
		shardOf[i] = uint8(si)
		start[si+1]++
	}
	for i := 1; i <= shardCount; i++ {
		start[i] += start[i-1]
	}
	order := make([]int32, len(changes))
	next := start
	for i, si := range shardOf {
		order[next[si]] = int32(i)
		next[si]++
	}
	for si := range shardCount {
		idx := order[start[si]:start[si+1]]
		if len(idx) == 0 {
			continue
		}
		s := &d.shards[si]
		s.mu.Lock()
		for _, i := range idx {
			c := &changes[i]
			if c.Kind == ChangeStored {
				s.add(c.Key, c.Meta, c.Loc)
			} else {
				s.remove(c.Key, c.Loc)
			}
		}
		s.mu.Unlock()
	}
}

// applyOne applies one stored or removed change to its shard s.
func (d *Directory) applyOne(s *dirShard, c Change) {
	s.mu.Lock()
	if c.Kind == ChangeStored {
		s.add(c.Key, c.Meta, c.Loc)
	} else {
		s.remove(c.Key, c.Loc)
	}
	s.mu.Unlock()
}

// Apply applies one change, as ApplyBatch does a batch of them: a Directory
// can so listen to the changes of a node's tiers and mirror them. It panics
// on a change of an unknown kind.
func (d *Directory) Apply(c Change) {
	switch c.Kind {
	case ChangeStored, ChangeRemoved:
		d.applyOne(d.shard(c.Key), c)
	case ChangeNodeDropped:
		d.DropNode(c.Loc.Node)
	default:
		panic(fmt.Sprintf("index: Apply: change has unknown kind %d", c.Kind))
	}
}

// Get returns a copy of key's entry.
func (d *Directory) Get(key Key) (Entry, bool) {
	s := d.shard(key)
	s.mu.RLock()
	defer s.mu.RUnlock()
	e := s.m[key]
	if e == nil {
		return Entry{}, false
	}
	return Entry{Meta: e.Meta, Locations: slices.Clone(e.Locations)}, true
}

// Lists reports whether key's entry has metadata meta and lists loc: the
// entry a stored change of key at loc with meta would leave as it is.
func (d *Directory) Lists(key Key, meta Meta, loc Location) bool {
	s := d.shard(key)
	s.mu.RLock()
	e := s.m[key]
	ok := e != nil && e.Meta == meta && slices.Contains(e.Locations, loc)
	s.mu.RUnlock()
	return ok
}

// Len returns the number of keys held somewhere.
func (d *Directory) Len() int {
	n := 0
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}

// Range calls fn for every entry until fn returns false. Entries added or
// removed during Range may or may not be seen; fn must not call back into d.
func (d *Directory) Range(fn func(Key, Entry) bool) {
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.RLock()
		for k, e := range s.m {
			if !fn(k, Entry{Meta: e.Meta, Locations: slices.Clone(e.Locations)}) {
				s.mu.RUnlock()
				return
			}
		}
		s.mu.RUnlock()
	}
}

// Lookup returns the longest prefix of chain (hashes of namespace ns, in
// order) held somewhere, and for each location how many leading blocks it
// holds. Locations for which usable returns false are ignored (a node marked
// down, say); a nil usable accepts all.
func (d *Directory) Lookup(ns NamespaceID, chain []Hash, usable func(Location) bool) Prefix {
	scan := PrefixScan{Usable: usable}
	for _, h := range chain {
		k := Key{NS: ns, Hash: h}
		s := d.shard(k)
		s.mu.RLock()
		e := s.m[k]
		s.mu.RUnlock()
		var locs []Location
		if e != nil {
			locs = e.Locations // entries are immutable once stored
		}
		if !scan.Next(locs) {
			break
		}
	}
	return scan.Prefix()
}

// DirectorySnapshot is a directory as of one instant, unaffected by later
// changes: what a Raft snapshot persists.
type DirectorySnapshot struct {
	shards [shardCount]map[Key]*Entry
}

// Snapshot captures the directory without copying it: each shard's map is
// shared until its next write copies it.
func (d *Directory) Snapshot() *DirectorySnapshot {
	snap := &DirectorySnapshot{}
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		s.frozen = true
		snap.shards[i] = s.m
		s.mu.Unlock()
	}
	return snap
}

// Len returns the number of keys in the snapshot.
func (s *DirectorySnapshot) Len() int {
	n := 0
	for _, m := range s.shards {
		n += len(m)
	}
	return n
}

// Range calls fn for every entry of the snapshot until fn returns false;
// fn must not modify the Entry.
func (s *DirectorySnapshot) Range(fn func(Key, *Entry) bool) {
	for _, m := range s.shards {
		for k, e := range m {
			if !fn(k, e) {
				return
			}
		}
	}
}

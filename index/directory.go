package index

import (
	"cmp"
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
	// The low bits of an xxhash are uniform; mixing in the namespace keeps
	// engine-supplied sequential ids spread too.
	return &d.shards[(uint64(k.Hash)^uint64(k.NS)^uint64(k.Hash)>>32)%shardCount]
}

// Add records that loc holds key and sets its metadata.
func (d *Directory) Add(key Key, meta Meta, loc Location) {
	s := d.shard(key)
	s.mu.Lock()
	m := s.writable()
	e := &Entry{Meta: meta}
	if old := m[key]; old != nil {
		e.Locations = slices.Clone(old.Locations)
	}
	if !slices.Contains(e.Locations, loc) {
		e.Locations = append(e.Locations, loc)
	}
	m[key] = e
	s.mu.Unlock()
}

// Remove records that loc no longer holds key and reports whether it did. A
// key held nowhere is forgotten.
func (d *Directory) Remove(key Key, loc Location) bool {
	s := d.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
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
	var p Prefix
	// live are the locations that have held every block so far.
	var live []Location
	for i, h := range chain {
		k := Key{NS: ns, Hash: h}
		s := d.shard(k)
		s.mu.RLock()
		e := s.m[k]
		found := false
		if e != nil {
			if i == 0 {
				for _, l := range e.Locations {
					if usable == nil || usable(l) {
						live = append(live, l)
						found = true
					}
				}
			} else {
				for _, l := range e.Locations {
					if usable == nil || usable(l) {
						found = true
						break
					}
				}
				// Locations missing block i hold exactly i leading blocks.
				live = slices.DeleteFunc(live, func(l Location) bool {
					if slices.Contains(e.Locations, l) {
						return false
					}
					p.ByLocation = append(p.ByLocation, LocationBlocks{Location: l, Blocks: i})
					return true
				})
			}
		}
		s.mu.RUnlock()
		if !found {
			break
		}
		p.Blocks = i + 1
	}
	for _, l := range live {
		p.ByLocation = append(p.ByLocation, LocationBlocks{Location: l, Blocks: p.Blocks})
	}
	slices.SortFunc(p.ByLocation, func(a, b LocationBlocks) int {
		if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Location.Tier, b.Location.Tier); c != 0 {
			return c
		}
		return cmp.Compare(a.Location.Node, b.Location.Node)
	})
	return p
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

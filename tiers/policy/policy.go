// Package policy holds the eviction policies a tier can use: LRU, LFU with
// dynamic aging, a prefix-aware policy that evicts the leaves of a chain
// before their ancestors, S3-FIFO, W-TinyLFU and ARC (which keep blocks used
// once from displacing blocks used again, each also in a prefix-aware
// form), LHD (which learns online which blocks yield the most hits per unit
// of space and time), and Belady's offline optimum as a yardstick.
//
// A Policy only orders blocks; it never touches bytes. Policies are not safe
// for concurrent use: the tier hierarchy serialises calls under its lock.
package policy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvstrata/kvstrata/index"
)

// Entry is what a policy knows of a cached block.
type Entry struct {
	Key       index.Key
	Parent    index.Hash // the previous block of the chain, if HasParent
	HasParent bool
	Size      int64
}

// Policy decides which block a tier gives up next.
type Policy interface {
	// Add inserts a block just stored; for a block already held it counts
	// as an access (like Touch) and updates its entry.
	Add(e Entry)
	// Touch records an access to key and reports whether the policy holds it.
	Touch(key index.Key) bool
	// Remove forgets key, if held.
	Remove(key index.Key)
	// Victim returns the block to evict next without removing it, passing
	// over blocks for which skip returns true (pinned blocks, or blocks of
	// the request being stored). ok is false when no block qualifies. A
	// nil skip passes over nothing.
	Victim(skip func(index.Key) bool) (key index.Key, ok bool)
	// Len returns the number of blocks held.
	Len() int
	// Name is the policy's name as New takes it: "lru", "lfu", …
	Name() string
}

// The node's default policy of each tier (config.Default), chosen from the
// measurements in docs/BENCHMARKS.md: S3-FIFO where blocks first land
// (HBM, DRAM), LRU for the SSD and the object store, which hold DRAM's
// victims. The simulated replay models the same.
const (
	DefaultHBM, DefaultDRAM = "s3fifo", "s3fifo"
	DefaultSSD, DefaultS3   = "lru", "lru"
)

// Names lists the policies New can build.
var Names = []string{"lru", "lfu", "prefix", "s3fifo", "wtinylfu", "s3fifo-prefix", "wtinylfu-prefix", "arc", "arc-prefix", "lhd"}

// New returns the named online policy.
func New(name string) (Policy, error) {
	switch name {
	case "lru":
		return NewLRU(), nil
	case "lfu":
		return NewLFU(), nil
	case "prefix":
		return NewPrefix(), nil
	case "s3fifo":
		return NewS3FIFO(), nil
	case "wtinylfu":
		return NewWTinyLFU(), nil
	case "s3fifo-prefix":
		return NewS3FIFOPrefix(), nil
	case "wtinylfu-prefix":
		return NewWTinyLFUPrefix(), nil
	case "arc":
		return NewARC(), nil
	case "arc-prefix":
		return NewARCPrefix(), nil
	case "lhd":
		return NewLHD(), nil
	}
	return nil, fmt.Errorf("policy: unknown policy %q (want one of %s)", name, strings.Join(Names, ", "))
}

// Valid reports whether New knows name.
func Valid(name string) bool { return slices.Contains(Names, name) }

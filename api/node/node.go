// Package node is one cache node's operations: the limits that protect it,
// checksum checks where bytes enter it, leases, eviction by selector, and
// statistics, over a tiers.Hierarchy. The gRPC, RESP and data-plane front
// ends all call a Node, so a block put through one is seen by the others.
//
// A Node is safe for concurrent use.
package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
)

// Errors of the node layer; tiers' errors (ErrNotFound, ErrFull, …) pass
// through wrapped.
var (
	// ErrLimit marks a request over one of the node's limits; it was
	// refused before anything was applied. *LimitError carries the detail.
	ErrLimit = errors.New("node: over a limit")
	// ErrChecksum marks bytes that do not match the checksum sent with them.
	ErrChecksum = errors.New("node: checksum mismatch")
	// ErrUnknownLease is returned by Release for a lease that is unknown
	// or already released.
	ErrUnknownLease = errors.New("node: unknown lease")
)

// LimitError says which limit a request broke; it matches ErrLimit.
type LimitError struct{ Msg string }

func (e *LimitError) Error() string        { return e.Msg }
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// Config holds a node's limits and the directory that answers its
// lookups. New copies it, fills zero fields with their defaults
// (EnsureDefaults), then checks it (Validate).
type Config struct {
	// MaxBlockSize is the largest block accepted, in bytes. The default is
	// 4 MiB.
	MaxBlockSize int64
	// MaxBatchBlocks is the most blocks one put or get may carry. The
	// default is 1024.
	MaxBatchBlocks int
	// MaxBatchBytes is the most bytes one put may carry. The default is
	// 256 MiB.
	MaxBatchBytes int64
	// MaxLease caps a pin's lease. The default is 5 minutes.
	MaxLease time.Duration
	// ViewLease is how long a read may pin a block's bytes in place while
	// they are written to a socket. The default is 30 seconds.
	ViewLease time.Duration
	// FetchConcurrency sizes the reads from the slower tiers: a
	// data-plane get's read ahead (ReadAhead) keeps FetchConcurrency/4
	// chunks in flight (at least one), and a warm given no concurrency of
	// its own reads FetchConcurrency blocks at once. At most 1024. The
	// default is 16.
	FetchConcurrency int
	// Directory, if set, answers lookups for the whole cluster (a cluster
	// member's replica of the block directory, api/membership). The default,
	// nil, answers them from the node's own tiers.
	Directory ClusterLookup
}

// Defaults of Config.
const (
	DefaultMaxBlockSize   = 4 << 20
	DefaultMaxBatchBlocks = 1024
	DefaultMaxBatchBytes  = 256 << 20
	DefaultMaxLease       = 5 * time.Minute
	DefaultViewLease      = 30 * time.Second
)

// EnsureDefaults sets c's zero fields to their defaults.
func (c *Config) EnsureDefaults() {
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = DefaultMaxBlockSize
	}
	if c.MaxBatchBlocks == 0 {
		c.MaxBatchBlocks = DefaultMaxBatchBlocks
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxLease == 0 {
		c.MaxLease = DefaultMaxLease
	}
	if c.ViewLease == 0 {
		c.ViewLease = DefaultViewLease
	}
	if c.FetchConcurrency == 0 {
		c.FetchConcurrency = DefaultFetchConcurrency
	}
}

// Validate reports every problem with c in one error, naming each field;
// it matches tiers.ErrInvalidConfig. Call it after EnsureDefaults.
func (c *Config) Validate() error {
	var probs []string
	if c.MaxBlockSize <= 0 || c.MaxBlockSize > 1<<31 {
		probs = append(probs, fmt.Sprintf("MaxBlockSize %d outside (0, 2 GiB]", c.MaxBlockSize))
	}
	if c.MaxBatchBlocks <= 0 {
		probs = append(probs, fmt.Sprintf("MaxBatchBlocks %d is not positive", c.MaxBatchBlocks))
	}
	if c.MaxBatchBytes < c.MaxBlockSize {
		probs = append(probs, fmt.Sprintf("MaxBatchBytes %d is below MaxBlockSize %d", c.MaxBatchBytes, c.MaxBlockSize))
	}
	if c.MaxLease <= 0 {
		probs = append(probs, fmt.Sprintf("MaxLease %v is not positive", c.MaxLease))
	}
	if c.ViewLease <= 0 {
		probs = append(probs, fmt.Sprintf("ViewLease %v is not positive", c.ViewLease))
	}
	if c.FetchConcurrency <= 0 || c.FetchConcurrency > 1024 {
		probs = append(probs, fmt.Sprintf("FetchConcurrency %d outside [1, 1024]", c.FetchConcurrency))
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: node: %s", tiers.ErrInvalidConfig, strings.Join(probs, "; "))
}

// Node is a cache node.
type Node struct {
	h       *tiers.Hierarchy
	cfg     Config
	started time.Time

	mu        sync.Mutex
	leases    map[uint64]*tiers.Lease
	owners    map[uint64]string // the owner each lease was taken for (PinAs), where not ""
	nextLease uint64
}

// ClusterLookup answers lookups across a cluster's replicated directory
// (api/membership does).
type ClusterLookup interface {
	Lookup(ns index.NamespaceID, chain []index.Hash) index.Prefix
}

// New returns a node over h. The node owns h: Close closes it.
func New(h *tiers.Hierarchy, cfg Config) (*Node, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Node{h: h, cfg: cfg, started: time.Now(), leases: map[uint64]*tiers.Lease{}, owners: map[uint64]string{}}, nil
}

// Config returns the node's limits.
func (n *Node) Config() Config { return n.cfg }

// Hierarchy returns the node's storage.
func (n *Node) Hierarchy() *tiers.Hierarchy { return n.h }

// Info describes a node.
type Info struct {
	ID      index.NodeID
	Config  Config
	Tiers   []index.TierKind
	Started time.Time
}

// Info returns the node's identity and limits.
func (n *Node) Info() Info {
	return Info{ID: n.h.Node(), Config: n.cfg, Tiers: n.h.Kinds(), Started: n.started}
}

// CheckBatch refuses a batch of blocks over the node's limits, naming the
// first offending block.
func (n *Node) CheckBatch(metas []index.Header) error {
	if len(metas) > n.cfg.MaxBatchBlocks {
		return &LimitError{fmt.Sprintf("batch of %d blocks, over the %d-block limit", len(metas), n.cfg.MaxBatchBlocks)}
	}
	var total int64
	for i, m := range metas {
		if int64(m.Size) > n.cfg.MaxBlockSize {
			return &LimitError{fmt.Sprintf("block %d is %s, over the %s limit", i, units.FormatBytes(int64(m.Size)), units.FormatBytes(n.cfg.MaxBlockSize))}
		}
		total += int64(m.Size)
	}
	if total > n.cfg.MaxBatchBytes {
		return &LimitError{fmt.Sprintf("batch of %s, over the %s limit", units.FormatBytes(total), units.FormatBytes(n.cfg.MaxBatchBytes))}
	}
	return nil
}

// CheckKeys refuses a read of more keys than a batch may hold.
func (n *Node) CheckKeys(count int) error {
	if count > n.cfg.MaxBatchBlocks {
		return &LimitError{fmt.Sprintf("request for %d blocks, over the %d-block limit", count, n.cfg.MaxBatchBlocks)}
	}
	return nil
}

// checkBlock refuses one block over the node's size limit, naming it.
func (n *Node) checkBlock(m index.Header) error {
	if int64(m.Size) > n.cfg.MaxBlockSize {
		return &LimitError{fmt.Sprintf("block %v is %s, over the %s limit", m.Key, units.FormatBytes(int64(m.Size)), units.FormatBytes(n.cfg.MaxBlockSize))}
	}
	return nil
}

// Put stores one block after checking its size and checksum.
func (n *Node) Put(m index.Header, value []byte) error {
	if err := n.checkBlock(m); err != nil {
		return err
	}
	if int(m.Size) != len(value) {
		return fmt.Errorf("%w: block %v: meta says %d bytes, %d came", tiers.ErrInvalid, m.Key, m.Size, len(value))
	}
	if sum := index.Checksum(value); sum != m.Sum {
		return fmt.Errorf("block %v: bytes hash to %016x, sent with %016x: %w", m.Key, sum, m.Sum, ErrChecksum)
	}
	return n.h.Put(m, value)
}

// Reserve makes room for a block in the fastest tier; the caller fills it
// and calls Commit (see CommitChecked) or Abort.
func (n *Node) Reserve(m index.Header) (*tiers.PutReservation, error) {
	if err := n.checkBlock(m); err != nil {
		return nil, err
	}
	return n.h.Reserve(m)
}

// ReserveRoom is Reserve that takes the block's key only at Commit
// (tiers.Hierarchy.ReserveRoom): for a writer that fills the room at a
// client's pace.
func (n *Node) ReserveRoom(m index.Header) (*tiers.PutReservation, error) {
	if err := n.checkBlock(m); err != nil {
		return nil, err
	}
	return n.h.ReserveRoom(m)
}

// CommitChecked commits r if its bytes match sum, else aborts it.
func CommitChecked(r *tiers.PutReservation, m index.Header) error {
	if sum := index.Checksum(r.Bytes()); sum != m.Sum {
		r.Abort()
		return fmt.Errorf("block %v: bytes hash to %016x, sent with %016x: %w", m.Key, sum, m.Sum, ErrChecksum)
	}
	return r.Commit()
}

// Get appends a block's bytes to dst.
func (n *Node) Get(key index.Key, dst []byte) ([]byte, index.Header, index.TierKind, error) {
	return n.h.Get(key, dst)
}

// View returns a block's bytes pinned in place where possible; release the
// View once they are written out.
func (n *Node) View(key index.Key) (tiers.View, index.TierKind, error) {
	return n.h.View(key, n.cfg.ViewLease)
}

// ViewDevice is View that hands a block held in device memory (the HBM
// tier) out in place, as a DeviceView, rather than copied into host memory
// (tiers.Hierarchy.ViewDevice): exactly one of the two is not nil.
func (n *Node) ViewDevice(key index.Key) (tiers.View, tiers.DeviceView, index.TierKind, error) {
	return n.h.ViewDevice(key, n.cfg.ViewLease)
}

// Lookup returns the longest prefix of chain this node holds, per tier.
func (n *Node) Lookup(ns index.NamespaceID, chain []index.Hash) (index.Prefix, error) {
	if len(chain) > n.cfg.MaxBatchBlocks*64 {
		return index.Prefix{}, &LimitError{fmt.Sprintf("lookup of %d hashes, over the %d-hash limit", len(chain), n.cfg.MaxBatchBlocks*64)}
	}
	if d := n.cfg.Directory; d != nil {
		return d.Lookup(ns, chain), nil
	}
	return n.h.Lookup(ns, chain), nil
}

// Exists reports for each key whether some tier holds it.
func (n *Node) Exists(keys []index.Key) ([]bool, error) {
	if err := n.CheckKeys(len(keys)); err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, k := range keys {
		_, _, err := n.h.Find(k)
		out[i] = err == nil
	}
	return out, nil
}

// Locate says where each key is held: the kind of its fastest tier and,
// when that is an object store that has uploaded it, the object range a
// client may read it from directly (see tiers.Hierarchy.Locate).
func (n *Node) Locate(ctx context.Context, keys []index.Key) ([]tiers.Placement, error) {
	if err := n.CheckKeys(len(keys)); err != nil {
		return nil, err
	}
	return n.h.Locate(ctx, keys)
}

// Pin leases keys for ttl and returns the lease's id.
func (n *Node) Pin(keys []index.Key, ttl time.Duration) (uint64, time.Time, error) {
	return n.PinAs("", keys, ttl)
}

// PinAs is Pin for owner (a tenant): only ReleaseAs with the same owner
// ends the lease, so that one tenant cannot guess another's lease ids and
// let its blocks go.
func (n *Node) PinAs(owner string, keys []index.Key, ttl time.Duration) (uint64, time.Time, error) {
	if err := n.CheckKeys(len(keys)); err != nil {
		return 0, time.Time{}, err
	}
	if ttl <= 0 || ttl > n.cfg.MaxLease {
		return 0, time.Time{}, &LimitError{fmt.Sprintf("lease of %v outside (0, %v]", ttl, n.cfg.MaxLease)}
	}
	l, err := n.h.Pin(keys, ttl)
	if err != nil {
		return 0, time.Time{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	for id, old := range n.leases { // forget leases that ran out unreleased
		if old.Expires().Before(now) {
			delete(n.leases, id)
			delete(n.owners, id)
		}
	}
	n.nextLease++
	n.leases[n.nextLease] = l
	if owner != "" {
		n.owners[n.nextLease] = owner
	}
	return n.nextLease, l.Expires(), nil
}

// Release ends a lease.
func (n *Node) Release(id uint64) error { return n.ReleaseAs("", id) }

// ReleaseAs ends a lease PinAs took for owner; another owner's lease is
// unknown to it, exactly like one that never was.
func (n *Node) ReleaseAs(owner string, id uint64) error {
	n.mu.Lock()
	l := n.leases[id]
	if l != nil && n.owners[id] != owner {
		l = nil
	}
	if l != nil {
		delete(n.leases, id)
		delete(n.owners, id)
	}
	n.mu.Unlock()
	if l == nil {
		return fmt.Errorf("lease %d: %w", id, ErrUnknownLease)
	}
	l.Release()
	return nil
}

// Close closes the node's storage (persistent tiers keep their blocks).
func (n *Node) Close() error { return n.h.Close() }

// Package tiers is a cache node's local storage: the Tier interface that
// every storage level implements (dram, ssd, s3, …), the Hierarchy that
// places blocks in the fastest tier, demotes victims downward and promotes
// hits upward, and the errors they share. Eviction policies live in
// tiers/policy, backends in tiers/<name>, the conformance suite every
// backend passes in tiers/tiertest.
package tiers

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
)

// Errors shared by every tier; test for them with errors.Is.
var (
	ErrNotFound = errors.New("tiers: block not found")
	ErrFull     = errors.New("tiers: tier full")
	ErrTooLarge = errors.New("tiers: block too large")
	// ErrCorrupt marks a stored block whose bytes no longer match their
	// checksum. The tier drops such a block; callers treat it as a miss.
	ErrCorrupt = errors.New("tiers: block corrupt")
	ErrClosed  = errors.New("tiers: closed")
	// ErrUnavailable marks a tier that cannot be reached for now (an
	// object store that is down); its blocks are not lost. A Hierarchy
	// read of a block held there fails with it rather than ErrNotFound
	// (cached, out of reach): callers may serve it as a miss, but can tell
	// it from one, and try again later.
	ErrUnavailable = errors.New("tiers: tier unavailable")
	// ErrBusy marks a Put a tier cannot take for now although it has room
	// (an upload backlog): evicting from it does not help, so the caller
	// drops the block or keeps it where it is and tries later.
	ErrBusy = errors.New("tiers: tier busy")
	// ErrNoSpace marks a Put refused because the device under the tier
	// (its file system) has no room left, whatever the tier's configured
	// capacity. Evicting from the tier frees the device's space only once
	// the tier reclaims it, later, so the caller puts the block in a lower
	// level or drops it rather than evicting and waiting.
	ErrNoSpace = errors.New("tiers: no space left on the tier's device")
	// ErrInvalid marks a request that breaks the API contract (a Header whose
	// size or checksum does not match the bytes, say).
	ErrInvalid = errors.New("tiers: invalid request")
	// ErrInvalidConfig marks a configuration that fails validation.
	ErrInvalidConfig = errors.New("tiers: invalid config")
)

// SizeError is the error for a block over a tier's maximum block size; it
// matches ErrTooLarge.
type SizeError struct {
	Size, Limit int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("tiers: block is %s, over the %s limit", units.FormatBytes(e.Size), units.FormatBytes(e.Limit))
}

func (e *SizeError) Is(target error) bool { return target == ErrTooLarge }

// Stats is a tier's accounting at one instant.
type Stats struct {
	Capacity int64 // bytes the tier may hold
	Used     int64 // bytes it holds now, with any allocation overhead; ≤ Capacity
	Blocks   int64 // blocks it holds
}

// Tier is one storage level. Implementations are safe for concurrent use.
// Blocks are replaced, never merged: Put of an existing key replaces it.
type Tier interface {
	// Put stores value under m.Key. m.Size must be len(value), else
	// ErrInvalid; m.Sum must be index.Checksum(value): tiers store it unchecked
	// (the bytes are hashed once, where they enter the node) and a wrong sum
	// makes later reads fail with ErrCorrupt. Put fails with a *SizeError
	// over the tier's block limit and with ErrFull when there is no room; on
	// error nothing changes. The tier copies value.
	Put(m index.Header, value []byte) error
	// Get appends the block's bytes to dst and returns them with the block's
	// Header. It fails with ErrNotFound, or with ErrCorrupt when the stored
	// bytes fail their checksum (the tier then drops the block).
	Get(key index.Key, dst []byte) ([]byte, index.Header, error)
	// Stat returns a block's Header without reading its bytes.
	Stat(key index.Key) (index.Header, error)
	// Delete removes a block; ErrNotFound if absent.
	Delete(key index.Key) error
	// Scan calls fn for each block until fn returns false. Blocks put or
	// deleted during a Scan may or may not be seen; fn may call the tier.
	Scan(fn func(index.Header) bool) error
	Stats() Stats
	// Close releases the tier's resources; persistent tiers keep their
	// blocks for the next open. Every other method then fails with ErrClosed.
	Close() error
}

// CheckPut validates a Put's arguments against a block size limit; tiers
// call it first.
func CheckPut(m index.Header, value []byte, limit int64) error {
	if int64(len(value)) > limit {
		return &SizeError{Size: int64(len(value)), Limit: limit}
	}
	if int(m.Size) != len(value) {
		return fmt.Errorf("%w: meta says %d bytes, value has %d", ErrInvalid, m.Size, len(value))
	}
	return nil
}

// Invalidator is implemented by persistent tiers whose Delete may not
// survive a crash when it returns (ssd, which flushes its deletes to disk
// in the background; s3, which rewrites its index objects in the
// background). Before a Put that replaces a key returns, the
// hierarchy has such a tier invalidate the key when it holds an older copy
// or deleted one lately, so that a crash cannot bring an older version
// back in place of an acknowledged newer one.
type Invalidator interface {
	// Invalidate deletes key's block if the tier holds one and returns
	// once neither it nor any block of key deleted before the call can be
	// read after a crash and reopen.
	Invalidate(key index.Key) error
	// MayResurrect reports whether a block of key deleted earlier might
	// be read again after a crash, or (a tier other nodes write to) the
	// tier holds one the hierarchy may not know of. It must be cheap: it
	// is asked on every Put of a key the hierarchy does not know the tier
	// holds.
	MayResurrect(key index.Key) bool
}

// View is a pinned, zero-copy window on one block's bytes inside a tier.
type View interface {
	// Bytes returns the block's bytes; callers must not write to them.
	Bytes() []byte
	Meta() index.Header
	// Release unpins the block; it reports an error when the lease ran out
	// first and the bytes may have changed meanwhile.
	Release() error
}

// Viewer is implemented by tiers that can hand out a block's bytes without
// copying them (dram). The pin lasts until Release or until lease runs out.
type Viewer interface {
	View(key index.Key, lease time.Duration) (View, error)
}

// Reservation is room for one block inside a tier, filled in place (from a
// socket, say) and then published with Commit or given back with Abort.
type Reservation interface {
	Bytes() []byte
	// Commit publishes the block; the caller has checked the bytes against
	// the Header's Sum.
	Commit() error
	// Abort gives the room back; a no-op after Commit.
	Abort()
}

// Reserver is implemented by tiers that can be written in place (dram).
type Reserver interface {
	Reserve(m index.Header) (Reservation, error)
}

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
	// ErrDeviceFailing marks a Put refused because the device under the
	// tier failed writes lately for another reason than space (an I/O
	// error). As with ErrNoSpace, evicting from the tier does not help: the
	// caller puts the block in a lower level or drops it.
	ErrDeviceFailing = errors.New("tiers: the tier's device is failing writes")
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
// A tier may also implement optional extras (Viewer, Reserver, …; see
// extras.go), which callers discover with a type assertion.
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

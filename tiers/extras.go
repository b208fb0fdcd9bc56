package tiers

import (
	"context"
	"io"
	"time"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/bufpool"
)

// The optional extras of a Tier. A backend implements those its storage
// makes cheap and says which with compile-time assertions
// (var _ tiers.Viewer = (*Tier)(nil)); callers discover them with a type
// assertion and fall back to the plain Tier methods without them. The
// conformance suite (tiers/tiertest) exercises each extra a backend has.
//
//	extra                 dram  ssd  s3   used by
//	Viewer                 ✓              Hierarchy.View, demotion (zero-copy reads)
//	Reserver               ✓              Hierarchy.Reserve (writes in place)
//	Invalidator                  ✓    ✓   Hierarchy.Put of a key a level may bring back
//	ManyGetter                   ✓    ✓   Hierarchy.ReadMany (batched reads)
//	PooledManyGetter             ✓    ✓   Hierarchy.ReadManyPooled (batched reads into reused buffers)
//	PooledGetter                 ✓        Hierarchy.ReadManyPooled (one block into a reused buffer)
//	ObjectLocator                     ✓   Hierarchy.Locate (reads straight from the store)
//	AvailabilityReporter              ✓   Hierarchy.Stats (LevelStats.Unavailable)
//	DegradationReporter          ✓        Hierarchy.Stats (LevelStats.Degraded)
//	DetailReporter               ✓    ✓   Hierarchy.Stats (LevelStats.Detail)
//	HostArena              ✓              New: pinned for a HostPinner level's DMA
//	HostPinner                             New (hbm: registers HostArena memory)
//	HostCopier                             demotion into a Reserver level (hbm: DMA into DRAM)
//	FileLocator                  ✓        promotion into a FileFiller level (blocks kept in files)
//	FileFiller                             promotion from a FileLocator level (hbm: GPUDirect Storage)
//	DeviceViewer                           callers in the process (hbm: device addresses), Hierarchy.ViewDevice
//	DeviceStager                           the data plane (hbm: DeviceViews staged through pinned host buffers)

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
// View fails as Get does: ErrNotFound, ErrClosed.
type Viewer interface {
	View(key index.Key, lease time.Duration) (View, error)
}

// Reservation is room for one block inside a tier, filled in place (from a
// socket, say) and then published with Commit or given back with Abort.
type Reservation interface {
	Bytes() []byte
	// Commit publishes the block, replacing any block of its key; the
	// caller has checked the bytes against the Header's Sum. A second Commit,
	// or one after Abort, fails with ErrInvalid.
	Commit() error
	// Abort gives the room back; a no-op after Commit.
	Abort()
}

// SumSetter is implemented by Reservations whose Header's Sum may be set
// after Reserve, before Commit: a writer that hashes the bytes while it
// fills them learns the Sum only then (PutReservation.SetSum).
type SumSetter interface {
	SetSum(sum uint64)
}

// Reserver is implemented by tiers that can be written in place (dram).
// Reserve fails as Put does: a *SizeError over the block limit, ErrFull
// when there is no room, ErrClosed.
type Reserver interface {
	Reserve(m index.Header) (Reservation, error)
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

// ManyGetter is implemented by tiers that read a batch of blocks faster
// than one after another (an object store coalesces adjacent blocks into
// one request; an SSD keeps several reads in flight). fn is called once per key, one call at a time, in any
// order, with the block's bytes or the error Get would return for it;
// value is the caller's to keep. GetMany itself fails only when the whole
// batch does (the tier is closed, ctx is done).
type ManyGetter interface {
	GetMany(ctx context.Context, keys []index.Key, fn func(i int, value []byte, m index.Header, err error)) error
}

// PooledManyGetter is a ManyGetter that can read into buffers it reuses
// rather than fresh ones: fn gets with each block's value a reference on
// the buffer holding it (nil when value is the caller's to keep), owns
// that reference, and must Release it once done with value — after which
// the bytes may be overwritten by a later read. A holder that hands value
// on (to a socket, to a promotion) Retains a reference for each.
type PooledManyGetter interface {
	GetManyPooled(ctx context.Context, keys []index.Key, fn func(i int, value []byte, ref *bufpool.Buffer, m index.Header, err error)) error
}

// PooledGetter is implemented by tiers that can read one block into a
// buffer they reuse, as a PooledManyGetter reads a batch: GetPooled returns
// the block's bytes and a reference on the buffer holding them (nil when
// the bytes are the caller's to keep, and with an error), which the caller
// owns and must Release once done with the bytes. Get's errors apply.
type PooledGetter interface {
	GetPooled(key index.Key) ([]byte, *bufpool.Buffer, index.Header, error)
}

// ObjectLocator is implemented by object-store tiers whose stored blocks a
// client with its own credentials may read straight from the store.
// LocateObject fails with ErrNotFound for a block the store does not hold
// yet (not uploaded) or at all.
type ObjectLocator interface {
	LocateObject(ctx context.Context, key index.Key) (ObjectRange, error)
}

// AvailabilityReporter is implemented by tiers that can be out of reach
// (an object store that is down): Available returns nil while the tier can
// be reached, else why not, as an error matching ErrUnavailable.
type AvailabilityReporter interface {
	Available() error
}

// DegradationReporter is implemented by tiers that, although they can be
// read, may refuse writes for a while (a local disk that is full):
// Degraded returns why, or nil while they take writes.
type DegradationReporter interface {
	Degraded() error
}

// DetailReporter is implemented by tiers that keep counters of their own
// (objects, segments, request errors …): Detail returns them by name, for
// statistics and metrics.
type DetailReporter interface {
	Detail() map[string]int64
}

// HostArena is implemented by tiers whose blocks live in one region of
// host memory outside the Go heap (dram): a device tier registers it for
// DMA, so copies between the two run at the bus's speed.
type HostArena interface {
	HostArena() []byte
}

// HostPinner is implemented by device tiers (hbm) that can register host
// memory for DMA. New pins every HostArena level into every HostPinner
// level; a failure to pin is not fatal (copies are then staged by the
// driver), and shows in the level's Detail.
type HostPinner interface {
	PinHost(region []byte) error
}

// HostCopier is implemented by tiers whose blocks live outside host memory
// (hbm, in device memory) and can copy one straight into host memory the
// caller holds: demotion copies into the room a Reserver level below
// reserved for the block, with no buffer in between, and the copy runs as
// DMA when that level's HostArena is pinned. CopyOut copies key's block
// into dst, which must be exactly the block's size (else ErrInvalid), and
// returns the block's Header once every byte has arrived: the caller
// commits dst only then. It fails as Get does; after an error dst holds
// bytes to be discarded.
type HostCopier interface {
	CopyOut(key index.Key, dst []byte) (index.Header, error)
}

// DeviceView is a pinned block in device memory: its address stays the
// block's until Release.
type DeviceView interface {
	// Pointer is the block's device address (a CUdeviceptr).
	Pointer() uint64
	// Device is the ordinal of the GPU holding it.
	Device() int
	Meta() index.Header
	Release() error
}

// DeviceViewer is implemented by tiers in device memory (hbm), for a
// caller in the same process that hands blocks to its own kernels.
type DeviceViewer interface {
	DeviceView(key index.Key, lease time.Duration) (DeviceView, error)
}

// DeviceStager is implemented by the DeviceViews of tiers that lend pinned
// host memory for copies out of the device (hbm: a small pool of bounce
// buffers): Stage copies the block by DMA into one and returns a View of
// those bytes, whose Release gives the buffer back. The DeviceView stays
// pinned and must still be released. A failed copy returns an error and
// keeps no buffer.
type DeviceStager interface {
	Stage() (View, error)
}

// BlockFile is an open file in which a tier keeps blocks' bytes.
type BlockFile interface {
	io.ReaderAt
	// Fd is the file's descriptor, for a reader with its own path to the
	// disk (cuFile registers it).
	Fd() uintptr
}

// FileExtent is where one block's bytes lie in a file a tier keeps: Meta's
// Size bytes from Offset in File. The tier neither moves nor reuses those
// bytes, and keeps File open, until Release.
type FileExtent interface {
	File() BlockFile
	Offset() int64
	Meta() index.Header
	Release() error
}

// FileLocator is implemented by tiers that keep blocks whole in files of
// their own (ssd, for blocks above its inline size), so that a reader with
// its own path to the disk — GPUDirect Storage into device memory — reads
// them there rather than through the tier. LocateFile fails as Get does,
// and with ErrNotFound also for a block the tier holds elsewhere than in a
// file. The bytes are as put, unchecked: the reader checks them against
// Meta's Sum.
type FileLocator interface {
	LocateFile(key index.Key) (FileExtent, error)
}

// FileFiller is implemented by tiers that can fill a block straight from a
// file (hbm: cuFile reads into device memory): promotion from a
// FileLocator level stores the block with no host buffer in between.
// FillFromFile stores ext's block under its Meta only once its bytes match
// Meta's Sum (else an error wrapping ErrCorrupt, and the tier is as it
// was); otherwise it fails as Put does, or with errors.ErrUnsupported when
// the tier is configured not to fill from files. It does not Release ext.
// The hierarchy promotes through Get and Put instead when FillFromFile is
// unsupported or finds the bytes corrupt (Get then checks them itself and
// drops a corrupt copy).
type FileFiller interface {
	FillFromFile(ext FileExtent) error
}

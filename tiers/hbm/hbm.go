//go:build cuda

// Package hbm is the GPU-memory tier, the top of a node's hierarchy on a
// machine with an NVIDIA GPU. It allocates one pool of device memory at
// start and carves it with the same page allocator the DRAM tier uses
// (tiers/internal/arena), so blocks cost the driver nothing after start
// and a full tier never fragments the device's memory. Block bytes live
// only in device memory: they enter and leave by DMA (cuMemcpy on a
// stream), never through a Go slice on the device side, and a caller in
// the same process can hand a block's device address to its kernels
// (DeviceView).
//
// Copies run on a small set of streams. A copy from or into host memory the
// tier has registered (PinHost: the DRAM tier's arena) is DMA at the bus's
// speed; from other host memory the driver stages it, at about half. In a
// hierarchy, a block demoted into DRAM is copied straight into the room
// DRAM reserved for it (CopyOut), and one promoted from DRAM straight from
// DRAM's arena, so both are DMA with no buffer between; Detail counts the
// bytes copied each way (dma_bytes, staged_bytes). A DeviceView can also
// be staged (tiers.DeviceStager): copied by DMA into one of a small pool of
// pinned bounce buffers, for a data plane that cannot send from device
// memory (bounce.go).
//
// A block promoted out of the SSD tier, which keeps large blocks in files
// of its own, is read from its file straight into the pages reserved for
// it (FillFromFile, tiers.FileFiller): through cuFile — GPUDirect Storage,
// or cuFile's compatibility mode without the nvidia-fs module — where
// libcufile loads (gpu/cufile), else through pinned staging buffers; the
// bytes are checked against the block's checksum before it is stored
// (file.go says how, and what Detail counts).
//
// The driver is loaded at run time (gpu/cuda), and the package builds only
// with the cuda tag: a default binary has no CUDA dependency.
package hbm

import (
	"fmt"
	"math/bits"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/internal/arena"
)

// Config configures an HBM tier; zero fields but Capacity take defaults.
type Config struct {
	// Device is the GPU's ordinal. Default 0.
	Device int
	// Capacity is the pool of device memory the tier allocates at start,
	// rounded up to a whole page. Required, > 0, and it must fit the
	// device's free memory.
	Capacity int64
	// PageSize is the allocation unit, a power of two from 4 KiB to 2 MiB.
	// Default 64 KiB.
	PageSize int
	// MaxBlockSize is the largest block accepted. Default 4 MiB, or
	// Capacity when that is smaller.
	MaxBlockSize int64
	// Streams is how many copies run at once. Default 4.
	Streams int
	// GDS is how FillFromFile reads a block from a file (a promotion out
	// of the SSD tier): GDSAuto (the default) through cuFile when
	// libcufile loads — GPUDirect Storage, or cuFile's compatibility mode
	// where the nvidia-fs module is missing — else as GDSStaged; GDSStaged
	// with pread into pinned host buffers and a copy to the device; GDSOff
	// not at all (promotions then read through the SSD tier's Get and this
	// tier's Put).
	GDS string
	// GDSTrustDisk skips the check of the bytes cuFile reads into device
	// memory against the block's checksum. By default FillFromFile copies
	// them back through pinned host memory and hashes them there before the
	// block is stored, which costs a device-to-host copy of the block; the
	// staged reads check the bytes in the pinned buffers in any case.
	GDSTrustDisk bool
}

// Values of Config.GDS.
const (
	GDSAuto   = "auto"
	GDSStaged = "staged"
	GDSOff    = "off"
)

// Defaults of Config.
const (
	DefaultPageSize     = 64 << 10
	DefaultMaxBlockSize = 4 << 20
	DefaultStreams      = 4
)

func (c *Config) ensureDefaults() {
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = min(DefaultMaxBlockSize, max(c.Capacity, 1))
	}
	if c.Streams == 0 {
		c.Streams = DefaultStreams
	}
	if c.GDS == "" {
		c.GDS = GDSAuto
	}
}

func (c *Config) validate() error {
	var probs []string
	bad := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	if c.Capacity <= 0 {
		bad("Capacity is %d, want > 0", c.Capacity)
	}
	if c.PageSize < 4<<10 || c.PageSize > 2<<20 || bits.OnesCount(uint(c.PageSize)) != 1 {
		bad("PageSize is %d, want a power of two from 4096 to 2097152", c.PageSize)
	}
	if c.MaxBlockSize <= 0 || (c.Capacity > 0 && c.MaxBlockSize > c.Capacity) {
		bad("MaxBlockSize is %d, want > 0 and ≤ Capacity", c.MaxBlockSize)
	}
	if c.Streams < 1 || c.Streams > 64 {
		bad("Streams is %d, want 1 to 64", c.Streams)
	}
	if c.Device < 0 {
		bad("Device is %d, want ≥ 0", c.Device)
	}
	if c.GDS != GDSAuto && c.GDS != GDSStaged && c.GDS != GDSOff {
		bad("GDS is %q, want %q, %q or %q", c.GDS, GDSAuto, GDSStaged, GDSOff)
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("hbm: %w: %s", tiers.ErrInvalidConfig, strings.Join(probs, "; "))
}

// Tier is an HBM tier.
type Tier struct {
	cfg  Config
	dev  *cuda.Device
	pool cuda.DevPtr
	size int64 // bytes of the pool
	page int64

	streams chan *cuda.Stream

	mu       sync.Mutex
	alloc    *arena.Allocator
	blocks   map[index.Key]*block
	used     int64
	inflight int // copies and views using the pool
	closed   bool
	released bool     // pool freed, device closed
	pinned   [][]byte // host regions registered with the device

	dmaBytes    int64 // bytes copied to or from pinned host memory
	stagedBytes int64 // bytes copied to or from other host memory

	files  fileReader // FillFromFile's
	bounce bounces    // DeviceView.Stage's
}

// block is the heap record of one block; its bytes are in device memory.
type block struct {
	meta         index.Header
	start, pages uint32
	users        int  // copies and views in progress
	dropped      bool // out of the map; pages freed when users reach 0
}

var (
	_ tiers.Tier           = (*Tier)(nil)
	_ tiers.DeviceViewer   = (*Tier)(nil)
	_ tiers.HostPinner     = (*Tier)(nil)
	_ tiers.HostCopier     = (*Tier)(nil)
	_ tiers.DetailReporter = (*Tier)(nil)
	_ tiers.DeviceStager   = (*deviceView)(nil)
	_ tiers.FileFiller     = (*Tier)(nil)
)

// Open loads the CUDA driver, opens cfg.Device and allocates the pool. It
// fails with an error matching cuda.ErrNoDriver on a machine without a
// GPU, and with one matching tiers.ErrInvalidConfig for a bad cfg or a
// pool larger than the device's free memory.
func Open(cfg Config) (*Tier, error) {
	cfg.ensureDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	dev, err := drv.Open(cfg.Device)
	if err != nil {
		return nil, err
	}
	page := int64(cfg.PageSize)
	pages := (cfg.Capacity + page - 1) / page
	size := pages * page
	if free, _, err := dev.MemInfo(); err == nil && uint64(size) > free {
		dev.Close()
		return nil, fmt.Errorf("hbm: %w: Capacity %s is more than the %s free on %s", tiers.ErrInvalidConfig,
			units.FormatBytes(size), units.FormatBytes(int64(free)), dev.Name())
	}
	pool, err := dev.Alloc(size)
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("hbm: allocating %s on %s: %w", units.FormatBytes(size), dev.Name(), err)
	}
	t := &Tier{cfg: cfg, dev: dev, pool: pool, size: size, page: page,
		streams: make(chan *cuda.Stream, cfg.Streams),
		alloc:   arena.New(uint32(pages)), blocks: map[index.Key]*block{}}
	for range cfg.Streams {
		s, err := dev.NewStream()
		if err != nil {
			t.release()
			return nil, err
		}
		t.streams <- s
	}
	if err := t.openFiles(); err != nil {
		t.release()
		return nil, err
	}
	return t, nil
}

// Device names the GPU the tier lives on.
func (t *Tier) Device() string { return fmt.Sprintf("%d (%s)", t.dev.Ordinal(), t.dev.Name()) }

// MaxBlockSize is the largest block the tier accepts.
func (t *Tier) MaxBlockSize() int64 { return t.cfg.MaxBlockSize }

func (t *Tier) addr(b *block) cuda.DevPtr { return t.pool + cuda.DevPtr(int64(b.start)*t.page) }

// copyIn copies src into the device at dst on a free stream and waits.
func (t *Tier) copyIn(dst cuda.DevPtr, src []byte) error {
	t.count(src)
	s := <-t.streams
	defer func() { t.streams <- s }()
	err := s.HtoD(dst, src)
	if err == nil {
		err = s.Sync()
	}
	runtime.KeepAlive(src)
	return err
}

// copyOut copies len(dst) device bytes at src into dst and waits.
func (t *Tier) copyOut(dst []byte, src cuda.DevPtr) error {
	t.count(dst)
	s := <-t.streams
	defer func() { t.streams <- s }()
	err := s.DtoH(dst, src)
	if err == nil {
		err = s.Sync()
	}
	runtime.KeepAlive(dst)
	return err
}

// count adds a copy's bytes to the DMA or the staged count, by whether
// host lies in a region the tier pinned.
func (t *Tier) count(host []byte) {
	if len(host) == 0 {
		return
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(host)))
	n := int64(len(host))
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.pinned {
		if start := uintptr(unsafe.Pointer(unsafe.SliceData(r))); p >= start && p+uintptr(n) <= start+uintptr(len(r)) {
			t.dmaBytes += n
			return
		}
	}
	if t.bounce.pool.contains(p, uintptr(n)) {
		t.dmaBytes += n
		return
	}
	t.stagedBytes += n
}

// Put copies value into device memory under m.Key, replacing any block
// of that key.
func (t *Tier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, t.cfg.MaxBlockSize); err != nil {
		return err
	}
	b, err := t.reserve(m)
	if err != nil {
		return err
	}
	err = t.copyIn(t.addr(b), value)
	if err != nil {
		err = fmt.Errorf("hbm: copying %v to the device: %w", m.Key, err)
	}
	return t.publish(b, err)
}

// reserve allocates pages for a block of m.Size bytes, to be filled and
// then published (publish), and counts it in flight.
func (t *Tier) reserve(m index.Header) (*block, error) {
	pages := uint32(max((int64(m.Size)+t.page-1)/t.page, 1))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, tiers.ErrClosed
	}
	start, ok := t.alloc.Alloc(pages)
	if !ok {
		return nil, fmt.Errorf("hbm: no room for %s (%s of %s used): %w",
			units.FormatBytes(int64(m.Size)), units.FormatBytes(t.used), units.FormatBytes(t.size), tiers.ErrFull)
	}
	b := &block{meta: m, start: start, pages: pages, users: 1}
	t.used += int64(pages) * t.page
	t.inflight++
	return b, nil
}

// publish ends a reserved block's fill: it stores the block under its key,
// replacing any older one, when the fill succeeded (err is nil) and the
// tier is still open; else it frees the pages and returns err or
// ErrClosed.
func (t *Tier) publish(b *block, err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inflight--
	b.users--
	if err != nil || t.closed {
		t.freeLocked(b)
		if err != nil {
			return err
		}
		return tiers.ErrClosed
	}
	if old := t.blocks[b.meta.Key]; old != nil {
		t.dropLocked(old)
	}
	t.blocks[b.meta.Key] = b
	return nil
}

// Get appends the block's bytes to dst, copied from device memory. Device
// memory is trusted as DRAM is: the checksum travels with the Header to
// whoever checks it next.
func (t *Tier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	b, err := t.use(key)
	if err != nil {
		return dst, index.Header{}, err
	}
	n := len(dst)
	dst = append(dst, make([]byte, b.meta.Size)...)
	err = t.copyOut(dst[n:], t.addr(b))
	t.unuse(b)
	if err != nil {
		return dst[:n], index.Header{}, fmt.Errorf("hbm: copying %v from the device: %w", key, err)
	}
	return dst, b.meta, nil
}

// CopyOut copies key's block straight into dst, host memory the caller
// holds (tiers.HostCopier): the room a DRAM tier reserved for a block
// demoted out of this one. The copy is queued on a stream and the stream
// synchronized before CopyOut returns, so the caller may commit dst then;
// into memory the tier pinned (PinHost) it runs as DMA. dst must be
// exactly the block's size.
func (t *Tier) CopyOut(key index.Key, dst []byte) (index.Header, error) {
	b, err := t.use(key)
	if err != nil {
		return index.Header{}, err
	}
	defer t.unuse(b)
	if len(dst) != int(b.meta.Size) {
		return index.Header{}, fmt.Errorf("hbm: %w: %v is %d bytes, not %d", tiers.ErrInvalid, key, b.meta.Size, len(dst))
	}
	if err := t.copyOut(dst, t.addr(b)); err != nil {
		return index.Header{}, fmt.Errorf("hbm: copying %v from the device: %w", key, err)
	}
	return b.meta, nil
}

// use pins key's block against reuse of its pages.
func (t *Tier) use(key index.Key) (*block, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, tiers.ErrClosed
	}
	b := t.blocks[key]
	if b == nil {
		return nil, fmt.Errorf("hbm: %v: %w", key, tiers.ErrNotFound)
	}
	b.users++
	t.inflight++
	return b, nil
}

func (t *Tier) unuse(b *block) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b.users--
	t.inflight--
	if b.dropped && b.users == 0 {
		t.freeLocked(b)
	}
}

// dropLocked takes b out of the map; its pages are freed once no copy or
// view uses them.
func (t *Tier) dropLocked(b *block) {
	delete(t.blocks, b.meta.Key)
	b.dropped = true
	if b.users == 0 {
		t.freeLocked(b)
	}
}

func (t *Tier) freeLocked(b *block) {
	t.alloc.Release(b.start, b.pages)
	t.used -= int64(b.pages) * t.page
}

// Stat returns a block's Header.
func (t *Tier) Stat(key index.Key) (index.Header, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return index.Header{}, tiers.ErrClosed
	}
	if b := t.blocks[key]; b != nil {
		return b.meta, nil
	}
	return index.Header{}, fmt.Errorf("hbm: %v: %w", key, tiers.ErrNotFound)
}

// Delete removes a block.
func (t *Tier) Delete(key index.Key) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return tiers.ErrClosed
	}
	b := t.blocks[key]
	if b == nil {
		return fmt.Errorf("hbm: %v: %w", key, tiers.ErrNotFound)
	}
	t.dropLocked(b)
	return nil
}

// Scan calls fn with each block's Header, outside the lock.
func (t *Tier) Scan(fn func(index.Header) bool) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return tiers.ErrClosed
	}
	metas := make([]index.Header, 0, len(t.blocks))
	for _, b := range t.blocks {
		metas = append(metas, b.meta)
	}
	t.mu.Unlock()
	for _, m := range metas {
		if !fn(m) {
			break
		}
	}
	return nil
}

// Stats reports the pool's size and use, in whole pages.
func (t *Tier) Stats() tiers.Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tiers.Stats{Capacity: t.size, Used: t.used, Blocks: int64(len(t.blocks))}
}

// Detail reports the device, the host memory registered with it, and the
// bytes copied to and from host memory: as DMA (pinned) or staged by the
// driver (other memory, about half the speed); the bounce buffers of
// DeviceView.Stage (bounce_pinned_bytes, bounce_lent now, bounce_misses:
// stages that found the pool empty); and how FillFromFile reads
// blocks from files (gds_mode: 0 off, 1 staged, 2 cuFile's compatibility
// mode, 3 GPUDirect Storage) with the bytes read each way (gds_bytes,
// gds_compat_bytes, file_staged_bytes) and its checks (file_verified_bytes,
// file_corrupt, gds_errors).
func (t *Tier) Detail() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pinned int64
	for _, r := range t.pinned {
		pinned += int64(len(r))
	}
	d := map[string]int64{"device": int64(t.dev.Ordinal()), "pinned_host_bytes": pinned, "streams": int64(t.cfg.Streams),
		"dma_bytes": t.dmaBytes, "staged_bytes": t.stagedBytes}
	t.files.detail(d)
	t.bounce.detail(d)
	return d
}

// PinHost registers host memory outside the Go heap (the DRAM tier's
// arena) with the device, so that copies between it and the tier run as
// DMA. The region must stay mapped until the tier is closed.
func (t *Tier) PinHost(region []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return tiers.ErrClosed
	}
	if err := t.dev.RegisterHost(region); err != nil {
		return fmt.Errorf("hbm: pinning %s of host memory: %w", units.FormatBytes(int64(len(region))), err)
	}
	t.pinned = append(t.pinned, region)
	return nil
}

// deviceView is a pinned block in device memory.
type deviceView struct {
	t        *Tier
	b        *block
	released bool
	mu       sync.Mutex
}

// DeviceView pins a block and returns its device address, for a caller in
// this process to hand to its own kernels or copies. The lease is not
// enforced: the pages stay the block's until Release.
func (t *Tier) DeviceView(key index.Key, _ time.Duration) (tiers.DeviceView, error) {
	b, err := t.use(key)
	if err != nil {
		return nil, err
	}
	return &deviceView{t: t, b: b}, nil
}

func (v *deviceView) Pointer() uint64    { return uint64(v.t.addr(v.b)) }
func (v *deviceView) Device() int        { return v.t.dev.Ordinal() }
func (v *deviceView) Meta() index.Header { return v.b.meta }
func (v *deviceView) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.released {
		v.released = true
		v.t.unuse(v.b)
	}
	return nil
}

// Close refuses further calls, waits for copies in flight, and frees the
// pool, the streams and the pinned registrations. Device views still
// unreleased at Close are cut: their addresses become invalid.
func (t *Tier) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	deadline := time.Now().Add(10 * time.Second)
	for t.inflight > 0 && time.Now().Before(deadline) {
		t.mu.Unlock()
		time.Sleep(time.Millisecond)
		t.mu.Lock()
	}
	t.mu.Unlock()
	return t.release()
}

// release frees what Open took.
func (t *Tier) release() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released {
		return nil
	}
	t.released = true
	errs := append(t.closeFiles(), t.closeBounces()...)
	for _, r := range t.pinned {
		if err := t.dev.UnregisterHost(r); err != nil {
			errs = append(errs, err)
		}
	}
	t.pinned = nil
	for len(t.streams) > 0 {
		if err := (<-t.streams).Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := t.dev.Free(t.pool); err != nil {
		errs = append(errs, err)
	}
	if err := t.dev.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("hbm: close: %v", errs)
	}
	return nil
}

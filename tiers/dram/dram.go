// Package dram is the host-memory tier. Block bytes live in one arena mapped
// with mmap outside the Go heap, so tens of GiB of cached blocks cost the
// garbage collector nothing: the heap holds only a small record per block.
//
// The arena is cut into pages (Config.PageSize); a block occupies one
// contiguous run of ceil(size/PageSize) pages, so Stats.Used is exactly the
// memory the blocks take, rounding included, and never passes Capacity.
// Which pages are free is kept by tiers/internal/arena, which knows nothing
// of the memory itself.
//
// Reads either copy (Get) or hand out the arena's bytes without copying
// (View). A view pins its block's pages: a Delete or replacing Put takes the
// block out of the tier at once, but its pages are reused only after every
// view is released or its lease has run out. Writers may fill a block's pages
// in place (Reserve), straight from a socket, and publish it with Commit.
//
// A Tier is safe for concurrent use; copies into and out of the arena run
// outside its lock.
package dram

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/internal/units"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/internal/arena"
)

// ErrLeaseExpired is returned by View.Release when the view outlived its
// lease: its pages may have been reused, so bytes read late are suspect.
var ErrLeaseExpired = errors.New("dram: view lease expired")

// Config configures a DRAM tier. The zero value of every field but
// Capacity means its default; New applies them with EnsureDefaults.
type Config struct {
	// Capacity is the arena size in bytes, rounded up to a whole page.
	// Required, > 0; the daemon sizes it from free memory.
	Capacity int64
	// PageSize is the allocation unit in bytes, a power of two from 512 to
	// 1 MiB. The default is 4096: at most 4 KiB of rounding per block.
	PageSize int
	// MaxBlockSize is the largest block accepted, in bytes; at most
	// Capacity. The default is 4 MiB, or Capacity when that is smaller.
	MaxBlockSize int64
	// NoHugePages turns off the transparent-huge-page advice for the arena.
	// The default (false) asks for huge pages, which cuts TLB misses on
	// large copies.
	NoHugePages bool
}

// DefaultPageSize and DefaultMaxBlockSize are the defaults of Config.
const (
	DefaultPageSize     = 4096
	DefaultMaxBlockSize = 4 << 20
)

// EnsureDefaults replaces the zero value of every optional field with its
// default. It leaves invalid values for Validate to report.
func (c *Config) EnsureDefaults() {
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxBlockSize == 0 {
		c.MaxBlockSize = DefaultMaxBlockSize
		if c.Capacity > 0 && c.Capacity < c.MaxBlockSize {
			c.MaxBlockSize = c.Capacity
		}
	}
}

// Validate reports every problem of c in one error that wraps
// tiers.ErrInvalidConfig. Call it after EnsureDefaults: zero values of
// optional fields are reported as invalid.
func (c *Config) Validate() error {
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	if c.Capacity <= 0 {
		bad("Capacity is %d, want > 0", c.Capacity)
	}
	pageOK := c.PageSize >= 512 && c.PageSize <= 1<<20 && bits.OnesCount(uint(c.PageSize)) == 1
	if !pageOK {
		bad("PageSize is %d, want a power of two from 512 to 1048576", c.PageSize)
	}
	switch {
	case c.MaxBlockSize <= 0:
		bad("MaxBlockSize is %d, want > 0", c.MaxBlockSize)
	case c.Capacity > 0 && c.MaxBlockSize > c.Capacity:
		bad("MaxBlockSize (%s) is over Capacity (%s)",
			units.FormatBytes(c.MaxBlockSize), units.FormatBytes(c.Capacity))
	}
	if pageOK && c.Capacity/int64(c.PageSize) >= 1<<32 {
		bad("Capacity (%s) holds 2^32 pages of PageSize (%d) or more: raise PageSize",
			units.FormatBytes(c.Capacity), c.PageSize)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("dram: %w: %s", tiers.ErrInvalidConfig, strings.Join(problems, "; "))
}

// Tier is a DRAM tier.
type Tier struct {
	cfg  Config
	mem  []byte // the arena: pages of page bytes, mapped outside the Go heap
	page int64

	mu       sync.Mutex
	alloc    *arena.Allocator // which pages of mem are free
	blocks   map[index.Key]*block
	zombies  map[*block]struct{} // out of the map, pages held by views
	used     int64               // bytes of allocated pages
	inflight int                 // copies, reservations and views using the arena
	closed   bool
	unmapped bool
}

// block is the heap record of one block; its bytes are in the arena.
type block struct {
	meta         index.Header
	start, pages uint32
	readers      int   // copies in progress: never reclaimed under them
	views        int   // unreleased views
	leaseEnd     int64 // unix nanoseconds when the last view's lease ends
	freed        bool  // pages returned to the allocator
}

// The tiers.Tier extras a DRAM tier implements (see tiers/extras.go).
var (
	_ tiers.Tier      = (*Tier)(nil)
	_ tiers.Viewer    = (*Tier)(nil)
	_ tiers.Reserver  = (*Tier)(nil)
	_ tiers.HostArena = (*Tier)(nil)

	_ tiers.SumSetter = (*reservation)(nil)
)

// HostArena returns the arena's memory, for a device tier to register for
// DMA (tiers.HostArena). It stays mapped until the tier is closed and
// every view released.
func (t *Tier) HostArena() []byte { return t.mem }

// New maps an arena of cfg.Capacity bytes. It fills cfg's zero fields
// with their defaults and fails with an error wrapping
// tiers.ErrInvalidConfig when cfg is invalid.
func New(cfg Config) (*Tier, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	page := int64(cfg.PageSize)
	pages := (cfg.Capacity + page - 1) / page
	mem, err := unix.Mmap(-1, 0, int(pages*page), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("dram: map %s arena: %w", units.FormatBytes(pages*page), err)
	}
	if !cfg.NoHugePages {
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice only; kernels without THP refuse
	}
	return &Tier{
		cfg:     cfg,
		mem:     mem,
		page:    page,
		alloc:   arena.New(uint32(pages)),
		blocks:  make(map[index.Key]*block),
		zombies: make(map[*block]struct{}),
	}, nil
}

// MaxBlockSize returns the largest block the tier accepts.
func (t *Tier) MaxBlockSize() int64 { return t.cfg.MaxBlockSize }

func (t *Tier) bytes(b *block) []byte {
	off := int64(b.start) * t.page
	return t.mem[off : off+int64(b.meta.Size) : off+int64(b.meta.Size)]
}

// reservation is room for one block in the arena.
type reservation struct {
	t    *Tier
	b    *block
	done bool
}

// Reserve allocates room for the block m describes (m.Size bytes). It fails
// with a *tiers.SizeError over the block limit and with tiers.ErrFull when no
// run of free pages is large enough.
func (t *Tier) Reserve(m index.Header) (tiers.Reservation, error) {
	if int64(m.Size) > t.cfg.MaxBlockSize {
		return nil, &tiers.SizeError{Size: int64(m.Size), Limit: t.cfg.MaxBlockSize}
	}
	pages := uint32((int64(m.Size) + t.page - 1) / t.page)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, tiers.ErrClosed
	}
	start, ok := t.allocLocked(pages)
	if !ok {
		return nil, fmt.Errorf("dram: no room for %s (%s of %s used): %w",
			units.FormatBytes(int64(m.Size)), units.FormatBytes(t.used), units.FormatBytes(t.capacity()), tiers.ErrFull)
	}
	t.used += int64(pages) * t.page
	t.inflight++
	return &reservation{t: t, b: &block{meta: m, start: start, pages: pages}}, nil
}

// Bytes returns the reserved room, len(Bytes()) == m.Size.
func (r *reservation) Bytes() []byte { return r.t.bytes(r.b) }

// SetSum sets the Sum of the block's Header (tiers.SumSetter); call it
// before Commit. The block is not yet visible, so no lock is needed.
func (r *reservation) SetSum(sum uint64) { r.b.meta.Sum = sum }

// Commit publishes the block, replacing any block under its key. The caller
// must have filled Bytes() and checked them against the Header's Sum.
func (r *reservation) Commit() error {
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.done {
		return fmt.Errorf("%w: reservation already committed or aborted", tiers.ErrInvalid)
	}
	r.done = true
	t.inflight--
	if t.closed {
		t.freeLocked(r.b)
		t.maybeUnmapLocked()
		return tiers.ErrClosed
	}
	if old := t.blocks[r.b.meta.Key]; old != nil {
		t.dropLocked(old)
	}
	t.blocks[r.b.meta.Key] = r.b
	return nil
}

// Abort gives the reserved room back; it is a no-op after Commit.
func (r *reservation) Abort() {
	t := r.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	t.inflight--
	t.freeLocked(r.b)
	t.maybeUnmapLocked()
}

// Put copies value into the arena under m.Key.
func (t *Tier) Put(m index.Header, value []byte) error {
	if err := tiers.CheckPut(m, value, t.cfg.MaxBlockSize); err != nil {
		return err
	}
	r, err := t.Reserve(m)
	if err != nil {
		return err
	}
	copy(r.Bytes(), value)
	return r.Commit()
}

// Get appends the block's bytes to dst. Memory is trusted: the checksum is
// not recomputed here but travels with the block (Meta.Sum) to whoever
// checks it next.
func (t *Tier) Get(key index.Key, dst []byte) ([]byte, index.Header, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return dst, index.Header{}, tiers.ErrClosed
	}
	b := t.blocks[key]
	if b == nil {
		t.mu.Unlock()
		return dst, index.Header{}, fmt.Errorf("dram: %v: %w", key, tiers.ErrNotFound)
	}
	b.readers++
	t.inflight++
	t.mu.Unlock()

	dst = append(dst, t.bytes(b)...)

	t.mu.Lock()
	b.readers--
	t.inflight--
	t.settleLocked(b)
	t.mu.Unlock()
	return dst, b.meta, nil
}

// Stat returns a block's Meta.
func (t *Tier) Stat(key index.Key) (index.Header, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return index.Header{}, tiers.ErrClosed
	}
	if b := t.blocks[key]; b != nil {
		return b.meta, nil
	}
	return index.Header{}, fmt.Errorf("dram: %v: %w", key, tiers.ErrNotFound)
}

// Delete removes a block; its pages are reused once no view holds them.
func (t *Tier) Delete(key index.Key) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return tiers.ErrClosed
	}
	b := t.blocks[key]
	if b == nil {
		return fmt.Errorf("dram: %v: %w", key, tiers.ErrNotFound)
	}
	t.dropLocked(b)
	return nil
}

// Scan calls fn with the Header of each block, outside the tier's lock.
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

// Stats reports capacity and use; Used counts whole pages, including the
// pages of removed blocks that views still hold.
func (t *Tier) Stats() tiers.Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tiers.Stats{Capacity: t.capacity(), Used: t.used, Blocks: int64(len(t.blocks))}
}

func (t *Tier) capacity() int64 { return int64(len(t.mem)) }

// Close refuses further calls. The arena is unmapped once no copy or view
// is using it, so bytes a view hands out stay readable until released.
func (t *Tier) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	t.maybeUnmapLocked()
	return nil
}

// View pins a block and returns its bytes in the arena, without copying,
// for at most lease: after that the pages may be reused. Release it as soon
// as the bytes are sent.
func (t *Tier) View(key index.Key, lease time.Duration) (tiers.View, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, tiers.ErrClosed
	}
	b := t.blocks[key]
	if b == nil {
		return nil, fmt.Errorf("dram: %v: %w", key, tiers.ErrNotFound)
	}
	end := time.Now().Add(lease).UnixNano()
	b.views++
	b.leaseEnd = max(b.leaseEnd, end)
	t.inflight++
	return &view{t: t, b: b, leaseEnd: end}, nil
}

// view is a pinned window on one block's bytes.
type view struct {
	t        *Tier
	b        *block
	leaseEnd int64
	released bool
}

// Bytes returns the block's bytes in the arena; do not write to them.
func (v *view) Bytes() []byte { return v.t.bytes(v.b) }

// Meta returns the viewed block's Meta.
func (v *view) Meta() index.Header { return v.b.meta }

// Release unpins the block. It returns ErrLeaseExpired when the lease ran out
// first and the pages may have been reused meanwhile.
func (v *view) Release() error {
	t := v.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if v.released {
		return nil
	}
	v.released = true
	t.inflight--
	expired := time.Now().UnixNano() > v.leaseEnd && v.b.freed
	if !v.b.freed {
		v.b.views--
		t.settleLocked(v.b)
	}
	t.maybeUnmapLocked()
	if expired {
		return ErrLeaseExpired
	}
	return nil
}

// allocLocked allocates pages, first reclaiming removed blocks whose view
// leases have all run out if there is no room otherwise.
func (t *Tier) allocLocked(pages uint32) (uint32, bool) {
	if pages == 0 {
		return 0, true
	}
	if start, ok := t.alloc.Alloc(pages); ok {
		return start, true
	}
	now := time.Now().UnixNano()
	for b := range t.zombies {
		if b.readers == 0 && b.leaseEnd < now {
			t.freeLocked(b)
		}
	}
	return t.alloc.Alloc(pages)
}

// dropLocked takes b out of the map and frees its pages unless views or
// copies still hold them.
func (t *Tier) dropLocked(b *block) {
	delete(t.blocks, b.meta.Key)
	if b.readers == 0 && b.views == 0 {
		t.freeLocked(b)
		return
	}
	t.zombies[b] = struct{}{}
}

// settleLocked frees a removed block once nothing uses it.
func (t *Tier) settleLocked(b *block) {
	if _, dead := t.zombies[b]; dead && b.readers == 0 && b.views == 0 {
		t.freeLocked(b)
	}
}

func (t *Tier) freeLocked(b *block) {
	if b.freed {
		return
	}
	b.freed = true
	delete(t.zombies, b)
	t.alloc.Release(b.start, b.pages)
	t.used -= int64(b.pages) * t.page
}

func (t *Tier) maybeUnmapLocked() {
	if t.closed && t.inflight == 0 && !t.unmapped {
		t.unmapped = true
		_ = unix.Munmap(t.mem)
	}
}

//go:build cuda

package hbm

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Bounce buffers: a DeviceView's Stage (tiers.DeviceStager) copies its
// block by DMA into one of a small pool of pinned host buffers, one per
// stream, each of MaxBlockSize bytes, mapped and registered with the
// device on the first Stage; a data plane that cannot send from device
// memory sends from there. A Stage that finds every buffer lent out does
// not wait for one (its caller may be the one holding them, until its
// sends complete): it copies into a fresh host buffer instead, which the
// driver stages at about half the speed, and Detail counts it
// (bounce_misses).

// bounces is the tier's pool of pinned bounce buffers.
type bounces struct {
	once   sync.Once
	err    error  // why the pool could not be mapped
	region []byte // mmapped; registered with the device when pinned
	pinned bool
	free   chan []byte

	// under the tier's mu
	lent, misses int64
}

// setupBounces maps and pins the pool, once.
func (t *Tier) setupBounces() error {
	b := &t.bounce
	b.once.Do(func() {
		size := (t.cfg.MaxBlockSize + t.page - 1) / t.page * t.page
		region, err := unix.Mmap(-1, 0, int(size)*t.cfg.Streams, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			b.err = fmt.Errorf("hbm: mapping bounce buffers: %w", err)
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.released {
			_ = unix.Munmap(region)
			b.err = tiers.ErrClosed
			return
		}
		b.region = region
		// Unpinned bounce buffers still work: the driver stages their copies.
		b.pinned = t.dev.RegisterHost(region) == nil
		b.free = make(chan []byte, t.cfg.Streams)
		for i := range t.cfg.Streams {
			b.free <- region[int64(i)*size : int64(i+1)*size : int64(i+1)*size]
		}
	})
	return b.err
}

// closeBounces undoes setupBounces; the tier's mu is held and no buffer
// is lent out (Close waited for them).
func (t *Tier) closeBounces() []error {
	b := &t.bounce
	if b.region == nil {
		return nil
	}
	var errs []error
	if b.pinned {
		if err := t.dev.UnregisterHost(b.region); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unix.Munmap(b.region); err != nil {
		errs = append(errs, err)
	}
	b.region = nil
	return errs
}

// inBounce reports whether host lies in the pinned bounce region; the
// tier's mu is held.
func (b *bounces) inBounce(p, n uintptr) bool {
	if !b.pinned || len(b.region) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b.region)))
	return p >= start && p+n <= start+uintptr(len(b.region))
}

// Stage copies the view's block into a bounce buffer (tiers.DeviceStager).
func (v *deviceView) Stage() (tiers.View, error) {
	t := v.t
	v.mu.Lock()
	released := v.released
	v.mu.Unlock()
	if released {
		return nil, fmt.Errorf("hbm: %w: Stage of a released DeviceView", tiers.ErrInvalid)
	}
	if err := t.setupBounces(); err != nil {
		return nil, err
	}
	m := v.b.meta
	sv := &stagedView{t: t, m: m}
	select {
	case buf := <-t.bounce.free:
		sv.buf, sv.own = buf[:m.Size], true
	default:
		sv.buf = make([]byte, m.Size)
	}
	t.mu.Lock()
	t.inflight++ // Close waits for the buffer to come back
	if sv.own {
		t.bounce.lent++
	} else {
		t.bounce.misses++
	}
	t.mu.Unlock()
	buf := sv.buf
	if err := t.copyOut(buf, t.addr(v.b)); err != nil {
		_ = sv.Release()
		return nil, fmt.Errorf("hbm: copying %v from the device into a bounce buffer: %w", m.Key, err)
	}
	return sv, nil
}

// stagedView is a block's bytes in a bounce buffer (or, when the pool was
// empty, in a buffer of its own).
type stagedView struct {
	t    *Tier
	buf  []byte
	m    index.Header
	own  bool // buf is the pool's
	once sync.Once
}

func (s *stagedView) Bytes() []byte      { return s.buf }
func (s *stagedView) Meta() index.Header { return s.m }
func (s *stagedView) Release() error {
	s.once.Do(func() {
		t := s.t
		t.mu.Lock()
		if s.own {
			t.bounce.lent--
		}
		t.inflight--
		t.mu.Unlock()
		if s.own {
			t.bounce.free <- s.buf[:cap(s.buf)]
		}
		s.buf = nil
	})
	return nil
}

// detail adds the pool's counters to d; the tier's mu is held.
func (b *bounces) detail(d map[string]int64) {
	var pinned int64
	if b.pinned {
		pinned = int64(len(b.region))
	}
	d["bounce_pinned_bytes"], d["bounce_lent"], d["bounce_misses"] = pinned, b.lent, b.misses
}

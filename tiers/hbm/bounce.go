//go:build cuda

package hbm

import (
	"fmt"
	"sync"

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

// bounces is the tier's pool of pinned bounce buffers, one per stream,
// mapped on the first Stage.
type bounces struct {
	once sync.Once
	err  error // why the pool could not be mapped
	pool *pinnedPool

	// under the tier's mu
	lent, misses int64
}

// setupBounces maps and pins the pool, once.
func (t *Tier) setupBounces() error {
	b := &t.bounce
	b.once.Do(func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.released {
			b.err = tiers.ErrClosed
			return
		}
		size := (t.cfg.MaxBlockSize + t.page - 1) / t.page * t.page
		if b.pool, b.err = newPinnedPool(t.dev, t.cfg.Streams, size); b.err != nil {
			b.err = fmt.Errorf("hbm: mapping bounce buffers: %w", b.err)
		}
	})
	return b.err
}

// closeBounces undoes setupBounces; the tier's mu is held and no buffer
// is lent out (Close waited for them).
func (t *Tier) closeBounces() []error {
	b := &t.bounce
	if err := b.pool.close(t.dev); err != nil {
		return []error{err}
	}
	b.pool = nil
	return nil
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
	t.mu.Lock()
	if t.released {
		t.mu.Unlock()
		return nil, fmt.Errorf("hbm: Stage: %w", tiers.ErrClosed)
	}
	if buf, ok := t.bounce.pool.tryGet(); ok {
		sv.buf, sv.own = buf[:m.Size], true
	} else {
		sv.buf = make([]byte, m.Size)
	}
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
			t.bounce.pool.put(s.buf)
		}
		s.buf = nil
	})
	return nil
}

// detail adds the pool's counters to d; the tier's mu is held.
func (b *bounces) detail(d map[string]int64) {
	d["bounce_pinned_bytes"], d["bounce_lent"], d["bounce_misses"] = b.pool.pinnedBytes(), b.lent, b.misses
}

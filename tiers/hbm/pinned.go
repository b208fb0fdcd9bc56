//go:build cuda

package hbm

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/gpu/cuda"
)

// A pinnedPool is host memory mapped outside the Go heap and cut into
// equal slots, registered with the device (page-locked) when the driver
// allows it. Unpinned, it still works: the driver stages each copy from
// it, at about half the speed. The tier keeps two: the staging buffers of
// FillFromFile (file.go) and the bounce buffers of a DeviceView's Stage
// (bounce.go).
type pinnedPool struct {
	region []byte
	pinned bool
	free   chan []byte // the slots not lent out
}

// newPinnedPool maps slots slots of size bytes each and registers them
// with dev.
func newPinnedPool(dev *cuda.Device, slots int, size int64) (*pinnedPool, error) {
	region, err := unix.Mmap(-1, 0, int(size)*slots, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	p := &pinnedPool{region: region, pinned: dev.RegisterHost(region) == nil, free: make(chan []byte, slots)}
	for i := range int64(slots) {
		p.free <- region[i*size : (i+1)*size : (i+1)*size]
	}
	return p, nil
}

// get waits for a slot.
func (p *pinnedPool) get() []byte { return <-p.free }

// tryGet takes a slot if one is free.
func (p *pinnedPool) tryGet() ([]byte, bool) {
	select {
	case b := <-p.free:
		return b, true
	default:
		return nil, false
	}
}

// put gives back a slot get or tryGet lent, resliced or not.
func (p *pinnedPool) put(b []byte) { p.free <- b[:cap(b)] }

// pinnedBytes is how much of the pool is page-locked: all or nothing.
func (p *pinnedPool) pinnedBytes() int64 {
	if p == nil || !p.pinned {
		return 0
	}
	return int64(len(p.region))
}

// contains reports whether the n bytes at ptr lie in the pool's pinned
// memory.
func (p *pinnedPool) contains(ptr, n uintptr) bool {
	if p == nil || !p.pinned {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p.region)))
	return ptr >= start && ptr+n <= start+uintptr(len(p.region))
}

// close unregisters and unmaps the pool; no slot may be lent out.
func (p *pinnedPool) close(dev *cuda.Device) error {
	if p == nil {
		return nil
	}
	var errs []error
	if p.pinned {
		errs = append(errs, dev.UnregisterHost(p.region))
	}
	errs = append(errs, unix.Munmap(p.region))
	p.region = nil
	return errors.Join(errs...)
}

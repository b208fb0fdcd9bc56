// Package devmem makes the GPU-memory destinations of a Go client's gets
// (client.GetOptions.Device): a Stager lends the transport pinned host
// bounce buffers for blocks it cannot receive straight into device memory
// (TCP, a UCX without CUDA), copies each block from its bounce buffer to
// the device (cuMemcpyHtoDAsync) once its bytes are checked, and, for a
// block received straight into device memory (UCX built with CUDA),
// checks it by copying it back into a bounce buffer and hashing it there.
//
// The bounce buffers are one mmapped region, registered with the device
// (page-locked), so the copies run as DMA. A Get holds one buffer at a
// time; a Stager whose buffers are all lent out gives a fresh Go buffer
// instead (the driver then stages the copy) and counts it (Misses).
//
// A Stager is safe for concurrent use; close it after the gets that use it.
package devmem

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// Stager lends bounce buffers and copies blocks between them and one GPU.
type Stager struct {
	dev    *cuda.Device
	size   int
	region []byte
	pinned bool
	free   chan []byte
	stream chan *cuda.Stream

	mu             sync.Mutex
	lent, misses   int
	staged, direct int64
	closed         bool
}

// New maps buffers bounce buffers of size bytes each (the largest block
// to be received) and registers them with dev. A registration that fails
// is not fatal: copies are then staged by the driver (Pinned says so).
func New(dev *cuda.Device, buffers, size int) (*Stager, error) {
	if buffers < 1 || size < 1 {
		return nil, fmt.Errorf("devmem: %d buffers of %d bytes, want at least one of at least a byte", buffers, size)
	}
	region, err := unix.Mmap(-1, 0, buffers*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("devmem: mapping %d bounce buffers of %d bytes: %w", buffers, size, err)
	}
	st, err := dev.NewStream()
	if err != nil {
		_ = unix.Munmap(region)
		return nil, err
	}
	s := &Stager{dev: dev, size: size, region: region, free: make(chan []byte, buffers), stream: make(chan *cuda.Stream, 1)}
	s.pinned = dev.RegisterHost(region) == nil
	for i := range buffers {
		s.free <- region[i*size : (i+1)*size : (i+1)*size]
	}
	s.stream <- st
	return s, nil
}

// Pinned reports whether the bounce buffers are registered with the device.
func (s *Stager) Pinned() bool { return s.pinned }

// Stats are what a Stager counted.
type Stats struct {
	Lent   int   // bounce buffers lent out now
	Misses int   // blocks that found every bounce buffer lent out
	Staged int64 // bytes copied from a bounce buffer to the device
	Direct int64 // bytes received straight into device memory and verified
}

// Stats returns the Stager's counts.
func (s *Stager) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Lent: s.lent, Misses: s.misses, Staged: s.staged, Direct: s.direct}
}

// Dest returns the destination of a block at ptr, device memory of at
// least the block's size. With verify, a block received straight into
// device memory is copied back and checked against its checksum (a
// device-to-host copy of it); without, the transport's delivery is
// trusted. Blocks received through a bounce buffer are always checked.
func (s *Stager) Dest(ptr cuda.DevPtr, verify bool) transfer.DeviceTarget {
	t := transfer.DeviceTarget{Ptr: uint64(ptr), Device: s.dev.Ordinal(), Bounce: s.bounce,
		Unstage: func(data []byte) error { return s.copyIn(ptr, data) }}
	if verify {
		t.Verify = func(h index.Header) error { return s.verify(ptr, h) }
	}
	return t
}

// bounce lends a buffer of n bytes.
func (s *Stager) bounce(n int) ([]byte, func(), error) {
	if n > s.size {
		return nil, nil, fmt.Errorf("devmem: a block of %d bytes, over the %d-byte bounce buffers", n, s.size)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, nil, errClosed
	}
	s.mu.Unlock()
	select {
	case b := <-s.free:
		s.mu.Lock()
		s.lent++
		s.mu.Unlock()
		var once sync.Once
		return b[:n], func() {
			once.Do(func() {
				s.mu.Lock()
				s.lent--
				s.mu.Unlock()
				s.free <- b
			})
		}, nil
	default:
		s.mu.Lock()
		s.misses++
		s.mu.Unlock()
		return make([]byte, n), func() {}, nil
	}
}

var errClosed = errors.New("devmem: the stager is closed")

func (s *Stager) copyIn(ptr cuda.DevPtr, data []byte) error {
	st := <-s.stream
	defer func() { s.stream <- st }()
	err := st.HtoD(ptr, data)
	if err == nil {
		err = st.Sync()
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.staged += int64(len(data))
	s.mu.Unlock()
	return nil
}

// verify copies the block at ptr back into a bounce buffer and hashes it.
func (s *Stager) verify(ptr cuda.DevPtr, h index.Header) error {
	b, done, err := s.bounce(int(h.Size))
	if err != nil {
		return err
	}
	defer done()
	st := <-s.stream
	err = st.DtoH(b, ptr)
	if err == nil {
		err = st.Sync()
	}
	s.stream <- st
	if err != nil {
		return fmt.Errorf("devmem: copying block %v back to check it: %w", h.Key, err)
	}
	if sum := index.Checksum(b); sum != h.Sum {
		return fmt.Errorf("devmem: block %v hashes to %016x in device memory, sent with %016x: %w", h.Key, sum, h.Sum, transfer.ErrCorrupt)
	}
	s.mu.Lock()
	s.direct += int64(h.Size)
	s.mu.Unlock()
	return nil
}

// Close unregisters and unmaps the bounce buffers; none may be lent out.
func (s *Stager) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	lent := s.lent
	s.mu.Unlock()
	if lent > 0 {
		return fmt.Errorf("devmem: close with %d bounce buffers lent out", lent)
	}
	var errs []error
	errs = append(errs, (<-s.stream).Close())
	if s.pinned {
		errs = append(errs, s.dev.UnregisterHost(s.region))
	}
	errs = append(errs, unix.Munmap(s.region))
	return errors.Join(errs...)
}

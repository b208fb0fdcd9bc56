// Package cuda is the part of NVIDIA's CUDA driver API kvstrata uses —
// device memory, pinned host memory, streams and copies — loaded at run time
// from libcuda.so.1 with purego, so that building needs no CUDA toolkit and
// no cgo, and a binary that never calls Load has no CUDA dependency at all.
//
// A CUDA context is current per OS thread; every method here locks its
// goroutine to its thread and makes the device's primary context current
// for the duration of the call, so callers use a Device from any goroutine.
// Host memory handed to an asynchronous copy must stay valid and unmoved
// until the stream is synchronized: memory outside the Go heap (an mmapped
// arena) is; for Go slices, callers synchronize before the slice can go.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDriver marks a machine without a loadable CUDA driver (no GPU, or
// no NVIDIA driver installed).
var ErrNoDriver = errors.New("cuda: no CUDA driver")

// LibraryEnv names the environment variable that overrides the driver
// library's path (default libcuda.so.1, found by the dynamic loader).
const LibraryEnv = "KVSTRATA_LIBCUDA"

// Error is a failed driver call: the call and the CUresult it returned.
type Error struct {
	Op   string // the driver function: "cuMemAlloc_v2"
	Code int32  // the CUresult
	Name string // the CUresult's name, "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string { return fmt.Sprintf("cuda: %s: %s (%d)", e.Op, e.Name, e.Code) }

// CUresult codes callers test for.
const (
	errOutOfMemory          = 2
	errNoDevice             = 100
	errHostMemoryRegistered = 712
)

// IsOutOfMemory reports whether err is the driver's CUDA_ERROR_OUT_OF_MEMORY.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == errOutOfMemory
}

// DevPtr is an address in device memory (CUdeviceptr).
type DevPtr uint64

// Driver is a loaded CUDA driver.
type Driver struct {
	path    string
	version int32

	cuInit                    func(flags uint32) int32
	cuDriverGetVersion        func(v *int32) int32
	cuGetErrorName            func(code int32, s **byte) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32
	cuDeviceTotalMem          func(bytes *uint64, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuMemAlloc                func(p *DevPtr, n uint64) int32
	cuMemFree                 func(p DevPtr) int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemHostRegister         func(p unsafe.Pointer, n uint64, flags uint32) int32
	cuMemHostUnregister       func(p unsafe.Pointer) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuMemcpyHtoDAsync         func(dst DevPtr, src unsafe.Pointer, n uint64, s uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src DevPtr, n uint64, s uintptr) int32
	cuMemcpyDtoDAsync         func(dst, src DevPtr, n uint64, s uintptr) int32
}

var (
	loadOnce   sync.Once
	loaded     *Driver
	loadFailed error
)

// Load opens the driver once per process (later calls return the same
// Driver or error): $KVSTRATA_LIBCUDA if set, else libcuda.so.1. It fails
// with an error matching ErrNoDriver when the library is missing, lacks a
// function kvstrata needs, or finds no device.
func Load() (*Driver, error) {
	loadOnce.Do(func() {
		path := os.Getenv(LibraryEnv)
		if path == "" {
			path = "libcuda.so.1"
		}
		loaded, loadFailed = open(path)
	})
	return loaded, loadFailed
}

func open(path string) (*Driver, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDriver, path, err)
	}
	d := &Driver{path: path}
	for _, f := range []struct {
		fn   any
		name string
	}{
		{&d.cuInit, "cuInit"}, {&d.cuDriverGetVersion, "cuDriverGetVersion"}, {&d.cuGetErrorName, "cuGetErrorName"},
		{&d.cuDeviceGetCount, "cuDeviceGetCount"}, {&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetName, "cuDeviceGetName"},
		{&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxSetCurrent, "cuCtxSetCurrent"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"}, {&d.cuMemFree, "cuMemFree_v2"}, {&d.cuMemGetInfo, "cuMemGetInfo_v2"},
		{&d.cuMemHostRegister, "cuMemHostRegister_v2"}, {&d.cuMemHostUnregister, "cuMemHostUnregister"},
		{&d.cuStreamCreate, "cuStreamCreate"}, {&d.cuStreamDestroy, "cuStreamDestroy_v2"}, {&d.cuStreamSynchronize, "cuStreamSynchronize"},
		{&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"}, {&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
	} {
		sym, err := purego.Dlsym(lib, f.name)
		if err != nil {
			return nil, fmt.Errorf("%w: %s has no %s: %v", ErrNoDriver, path, f.name, err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == errNoDevice {
			return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
		}
		return nil, err
	}
	if err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&d.version)); err != nil {
		return nil, err
	}
	return d, nil
}

// check turns a CUresult into nil or an *Error.
func (d *Driver) check(op string, code int32) error {
	if code == 0 {
		return nil
	}
	name := "CUDA_ERROR_UNKNOWN"
	var s *byte
	if d.cuGetErrorName != nil && d.cuGetErrorName(code, &s) == 0 && s != nil {
		name = goString(s)
	}
	return &Error{Op: op, Code: code, Name: name}
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Path is the library the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// Version is the driver's CUDA version, as 1000·major + 10·minor.
func (d *Driver) Version() int { return int(d.version) }

// Count returns how many devices the driver sees.
func (d *Driver) Count() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device is one GPU with its primary context retained.
type Device struct {
	d       *Driver
	ordinal int
	dev     int32
	ctx     uintptr
	name    string
	total   uint64
	closed  bool
	mu      sync.Mutex
}

// Open retains device ordinal's primary context.
func (d *Driver) Open(ordinal int) (*Device, error) {
	n, err := d.Count()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device %d does not exist (%d devices)", ordinal, n)
	}
	dv := &Device{d: d, ordinal: ordinal}
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dv.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	var name [256]byte
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dv.dev)); err != nil {
		return nil, err
	}
	dv.name = goString(&name[0])
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&dv.total, dv.dev)); err != nil {
		return nil, err
	}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&dv.ctx, dv.dev)); err != nil {
		return nil, err
	}
	return dv, nil
}

// Name is the device's product name ("NVIDIA H200").
func (dv *Device) Name() string { return dv.name }

// Ordinal is the device's index among the driver's devices.
func (dv *Device) Ordinal() int { return dv.ordinal }

// TotalMemory is the device's memory in bytes.
func (dv *Device) TotalMemory() uint64 { return dv.total }

// call runs fn on a thread with dv's context current.
func (dv *Device) call(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dv.d.check("cuCtxSetCurrent", dv.d.cuCtxSetCurrent(dv.ctx)); err != nil {
		return err
	}
	return fn()
}

// Do runs fn on a locked OS thread with dv's context current: for calls
// into another library that works on the current context's memory
// (cuFile, gpu/cufile), made from any goroutine.
func (dv *Device) Do(fn func() error) error { return dv.call(fn) }

// MemInfo returns the device's free and total memory.
func (dv *Device) MemInfo() (free, total uint64, err error) {
	err = dv.call(func() error { return dv.d.check("cuMemGetInfo_v2", dv.d.cuMemGetInfo(&free, &total)) })
	return free, total, err
}

// Alloc allocates n bytes of device memory.
func (dv *Device) Alloc(n int64) (DevPtr, error) {
	var p DevPtr
	err := dv.call(func() error { return dv.d.check("cuMemAlloc_v2", dv.d.cuMemAlloc(&p, uint64(n))) })
	return p, err
}

// Free frees device memory Alloc returned.
func (dv *Device) Free(p DevPtr) error {
	return dv.call(func() error { return dv.d.check("cuMemFree_v2", dv.d.cuMemFree(p)) })
}

// RegisterHost page-locks b (memory outside the Go heap: an mmapped arena)
// and maps it for the device, so copies to and from it run as DMA at the
// bus's speed and may be asynchronous. A region already registered is not
// an error.
func (dv *Device) RegisterHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	const portable = 1 // CU_MEMHOSTREGISTER_PORTABLE: pinned for every context
	return dv.call(func() error {
		err := dv.d.check("cuMemHostRegister_v2", dv.d.cuMemHostRegister(unsafe.Pointer(&b[0]), uint64(len(b)), portable))
		var e *Error
		if errors.As(err, &e) && e.Code == errHostMemoryRegistered {
			return nil
		}
		return err
	})
}

// UnregisterHost undoes RegisterHost.
func (dv *Device) UnregisterHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return dv.call(func() error {
		return dv.d.check("cuMemHostUnregister", dv.d.cuMemHostUnregister(unsafe.Pointer(&b[0])))
	})
}

// Close releases the primary context; memory allocated in it must be
// freed first.
func (dv *Device) Close() error {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if dv.closed {
		return nil
	}
	dv.closed = true
	return dv.d.check("cuDevicePrimaryCtxRelease_v2", dv.d.cuDevicePrimaryCtxRelease(dv.dev))
}

// Stream is an ordered queue of asynchronous copies on one device.
type Stream struct {
	dv *Device
	s  uintptr
}

// NewStream creates a stream that does not synchronize with the legacy
// default stream.
func (dv *Device) NewStream() (*Stream, error) {
	const nonBlocking = 1 // CU_STREAM_NON_BLOCKING
	st := &Stream{dv: dv}
	err := dv.call(func() error { return dv.d.check("cuStreamCreate", dv.d.cuStreamCreate(&st.s, nonBlocking)) })
	return st, err
}

// HtoD queues a copy of src into device memory at dst. src must stay valid
// until Sync returns.
func (s *Stream) HtoD(dst DevPtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return s.dv.call(func() error {
		return s.dv.d.check("cuMemcpyHtoDAsync_v2", s.dv.d.cuMemcpyHtoDAsync(dst, unsafe.Pointer(&src[0]), uint64(len(src)), s.s))
	})
}

// DtoH queues a copy of len(dst) bytes of device memory at src into dst.
// dst must stay valid until Sync returns.
func (s *Stream) DtoH(dst []byte, src DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	return s.dv.call(func() error {
		return s.dv.d.check("cuMemcpyDtoHAsync_v2", s.dv.d.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), src, uint64(len(dst)), s.s))
	})
}

// DtoD queues a copy of n bytes between device addresses.
func (s *Stream) DtoD(dst, src DevPtr, n int64) error {
	if n == 0 {
		return nil
	}
	return s.dv.call(func() error {
		return s.dv.d.check("cuMemcpyDtoDAsync_v2", s.dv.d.cuMemcpyDtoDAsync(dst, src, uint64(n), s.s))
	})
}

// Sync waits for every copy queued on s.
func (s *Stream) Sync() error {
	return s.dv.call(func() error { return s.dv.d.check("cuStreamSynchronize", s.dv.d.cuStreamSynchronize(s.s)) })
}

// Close destroys the stream after its work is done.
func (s *Stream) Close() error {
	return s.dv.call(func() error { return s.dv.d.check("cuStreamDestroy_v2", s.dv.d.cuStreamDestroy(s.s)) })
}

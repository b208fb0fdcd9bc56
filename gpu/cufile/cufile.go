// Package cufile is the part of NVIDIA's cuFile API (GPUDirect Storage)
// kvstrata uses — the driver session, file handles, registered device
// buffers, and reads and writes between a file and device memory — loaded
// at run time from libcufile.so.0 with purego, as gpu/cuda loads the CUDA
// driver: building needs no toolkit and no cgo, and a binary that never
// calls Load has no cuFile dependency.
//
// cuFile moves bytes between a file and device memory in one of two ways.
// With NVIDIA's nvidia-fs kernel module loaded (GDS proper) the disk's DMA
// engine writes straight into GPU memory; without it, in cuFile's
// compatibility mode, the library reads into its own pinned host buffers
// and copies from there, as a program would. Driver.Mode says which.
//
// cuFile works on device memory of the CUDA context current on the calling
// thread: callers make every call but Load inside cuda.Device.Do. A Driver
// is safe for concurrent use; a Handle may be used by several reads at
// once.
package cufile

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoLibrary marks a machine without a loadable cuFile library (no GDS
// packages installed), or one that lacks a function kvstrata needs.
var ErrNoLibrary = errors.New("cufile: no cuFile library")

// LibraryEnv names the environment variable that overrides the library's
// path (default libcufile.so.0, found by the dynamic loader).
const LibraryEnv = "KVSTRATA_LIBCUFILE"

// Error is a failed cuFile call: the call and either the CUfileOpError it
// returned (Code, with the CUresult when Code is CU_FILE_CUDA_DRIVER_ERROR)
// or, for a read or write that failed in the file system, the errno.
type Error struct {
	Op    string // the cuFile function: "cuFileRead"
	Code  int32  // the CUfileOpError; 0 for a file-system error
	CUDA  int32  // the CUresult, when Code is CU_FILE_CUDA_DRIVER_ERROR
	Errno syscall.Errno
}

func (e *Error) Error() string {
	switch {
	case e.Code == 0:
		return fmt.Sprintf("cufile: %s: %v", e.Op, e.Errno)
	case e.Code == codeCUDADriverError:
		return fmt.Sprintf("cufile: %s: %s (%d, CUresult %d)", e.Op, codeName(e.Code), e.Code, e.CUDA)
	}
	return fmt.Sprintf("cufile: %s: %s (%d)", e.Op, codeName(e.Code), e.Code)
}

// Unwrap returns the errno of a file-system error, so that
// errors.Is(err, syscall.EIO) holds for one.
func (e *Error) Unwrap() error {
	if e.Errno != 0 {
		return e.Errno
	}
	return nil
}

// CUfileOpError codes: 0, or 5000 plus a small number.
const (
	codeBase                = 5000
	codeCUDADriverError     = codeBase + 11
	codeAlreadyRegistered   = codeBase + 23
	codeDriverAlreadyOpen   = codeBase + 26
	codeHandleAlreadyExists = codeBase + 28
)

var codeNames = map[int32]string{
	0: "CU_FILE_SUCCESS", codeBase + 1: "CU_FILE_DRIVER_NOT_INITIALIZED", codeBase + 2: "CU_FILE_DRIVER_INVALID_PROPS",
	codeBase + 3: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", codeBase + 4: "CU_FILE_DRIVER_VERSION_MISMATCH",
	codeBase + 5: "CU_FILE_DRIVER_VERSION_READ_ERROR", codeBase + 6: "CU_FILE_DRIVER_CLOSING",
	codeBase + 7: "CU_FILE_PLATFORM_NOT_SUPPORTED", codeBase + 8: "CU_FILE_IO_NOT_SUPPORTED",
	codeBase + 9: "CU_FILE_DEVICE_NOT_SUPPORTED", codeBase + 10: "CU_FILE_NVFS_DRIVER_ERROR",
	codeCUDADriverError: "CU_FILE_CUDA_DRIVER_ERROR", codeBase + 12: "CU_FILE_CUDA_POINTER_INVALID",
	codeBase + 13: "CU_FILE_CUDA_MEMORY_TYPE_INVALID", codeBase + 14: "CU_FILE_CUDA_POINTER_RANGE_ERROR",
	codeBase + 15: "CU_FILE_CUDA_CONTEXT_MISMATCH", codeBase + 16: "CU_FILE_INVALID_MAPPING_SIZE",
	codeBase + 17: "CU_FILE_INVALID_MAPPING_RANGE", codeBase + 18: "CU_FILE_INVALID_FILE_TYPE",
	codeBase + 19: "CU_FILE_INVALID_FILE_OPEN_FLAG", codeBase + 20: "CU_FILE_DIO_NOT_SET",
	codeBase + 22: "CU_FILE_INVALID_VALUE", codeAlreadyRegistered: "CU_FILE_MEMORY_ALREADY_REGISTERED",
	codeBase + 24: "CU_FILE_MEMORY_NOT_REGISTERED", codeBase + 25: "CU_FILE_PERMISSION_DENIED",
	codeDriverAlreadyOpen: "CU_FILE_DRIVER_ALREADY_OPEN", codeBase + 27: "CU_FILE_HANDLE_NOT_REGISTERED",
	codeHandleAlreadyExists: "CU_FILE_HANDLE_ALREADY_REGISTERED", codeBase + 29: "CU_FILE_DEVICE_NOT_FOUND",
	codeBase + 30: "CU_FILE_INTERNAL_ERROR", codeBase + 31: "CU_FILE_GETNEWFD_FAILED",
	codeBase + 33: "CU_FILE_NVFS_SETUP_ERROR", codeBase + 34: "CU_FILE_IO_DISABLED",
}

func codeName(c int32) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "CU_FILE_UNKNOWN_ERROR"
}

// Mode is how cuFile moves bytes on this machine.
type Mode int

// Modes of a Driver.
const (
	// ModeCompat is cuFile's compatibility mode: no nvidia-fs module, the
	// library reads through pinned host buffers of its own.
	ModeCompat Mode = iota + 1
	// ModeGDS is GPUDirect Storage proper: the disk's DMA reaches device
	// memory through the nvidia-fs module.
	ModeGDS
)

func (m Mode) String() string {
	switch m {
	case ModeCompat:
		return "compat"
	case ModeGDS:
		return "gds"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Library is a loaded libcufile.
type Library struct {
	path string

	// Functions returning a CUfileError_t by value return it as one
	// 8-byte integer: the struct {CUfileOpError err; CUresult cu_err} is
	// two 32-bit integers, which the C calling conventions of amd64 and
	// arm64 return in one register, err in the low half.
	driverOpen          func() uint64
	driverClose         func() uint64
	driverGetProperties func(p unsafe.Pointer) uint64
	handleRegister      func(fh *uintptr, d *descr) uint64
	handleDeregister    func(fh uintptr)
	bufRegister         func(p uintptr, n uint64, flags int32) uint64
	bufDeregister       func(p uintptr) uint64
	read                func(fh uintptr, base uintptr, n uint64, fileOff, bufOff int64) int64
	write               func(fh uintptr, base uintptr, n uint64, fileOff, bufOff int64) int64
	errnoLocation       func() *int32 // libc's; nil where it cannot be found

	mu    sync.Mutex
	opens int // Drivers open: the session is closed when the last one is
}

var (
	loadOnce   sync.Once
	loaded     *Library
	loadFailed error
)

// Load opens the library once per process (later calls return the same
// Library or error): $KVSTRATA_LIBCUFILE if set, else libcufile.so.0. It
// fails with an error matching ErrNoLibrary when the library is missing or
// lacks a function kvstrata needs. Loading starts no driver session
// (Open does).
func Load() (*Library, error) {
	loadOnce.Do(func() {
		path := os.Getenv(LibraryEnv)
		if path == "" {
			path = "libcufile.so.0"
		}
		loaded, loadFailed = open(path)
	})
	return loaded, loadFailed
}

func open(path string) (*Library, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoLibrary, path, err)
	}
	l := &Library{path: path}
	for _, f := range []struct {
		fn    any
		names []string // the first the library has
	}{
		{&l.driverOpen, []string{"cuFileDriverOpen"}},
		// cufile.h maps cuFileDriverClose to cuFileDriverClose_v2 since
		// CUDA 12; older libraries have only the first.
		{&l.driverClose, []string{"cuFileDriverClose_v2", "cuFileDriverClose"}},
		{&l.driverGetProperties, []string{"cuFileDriverGetProperties"}},
		{&l.handleRegister, []string{"cuFileHandleRegister"}}, {&l.handleDeregister, []string{"cuFileHandleDeregister"}},
		{&l.bufRegister, []string{"cuFileBufRegister"}}, {&l.bufDeregister, []string{"cuFileBufDeregister"}},
		{&l.read, []string{"cuFileRead"}}, {&l.write, []string{"cuFileWrite"}},
	} {
		var sym uintptr
		for _, name := range f.names {
			if sym, err = purego.Dlsym(lib, name); err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s has no %s: %v", ErrNoLibrary, path, f.names[0], err)
		}
		purego.RegisterFunc(f.fn, sym)
	}
	if libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
		if sym, err := purego.Dlsym(libc, "__errno_location"); err == nil {
			purego.RegisterFunc(&l.errnoLocation, sym)
		}
	}
	return l, nil
}

// Path is the library the functions were loaded from.
func (l *Library) Path() string { return l.path }

// status turns a returned CUfileError_t into nil or an *Error.
func status(op string, r uint64) error {
	code, cu := int32(uint32(r)), int32(uint32(r>>32))
	if code == 0 {
		return nil
	}
	e := &Error{Op: op, Code: code}
	if code == codeCUDADriverError {
		e.CUDA = cu
	}
	return e
}

// Driver is an open cuFile driver session.
type Driver struct {
	l      *Library
	mu     sync.Mutex
	closed bool
}

// Open starts the process's driver session (cuFileDriverOpen), or joins
// the one already open; the session ends when every Driver is closed.
func (l *Library) Open() (*Driver, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opens == 0 {
		err := status("cuFileDriverOpen", l.driverOpen())
		var e *Error
		if err != nil && !(errors.As(err, &e) && e.Code == codeDriverAlreadyOpen) {
			return nil, err
		}
	}
	l.opens++
	return &Driver{l: l}, nil
}

// Close leaves the driver session, ending it if this is the last Driver.
// Handles and buffers must be deregistered first.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.l.mu.Lock()
	defer d.l.mu.Unlock()
	if d.l.opens--; d.l.opens > 0 {
		return nil
	}
	return status("cuFileDriverClose", d.l.driverClose())
}

// Properties is what the driver says of itself (the first fields of
// CUfileDrvProps_t).
type Properties struct {
	// NVFSMajor and NVFSMinor are the nvidia-fs module's version; both 0
	// when the module is not loaded (compatibility mode).
	NVFSMajor, NVFSMinor uint32
	// MaxDirectIOSize is the largest I/O the module does in one piece, in
	// bytes.
	MaxDirectIOSize uint64
}

// drvProps mirrors the start of CUfileDrvProps_t: the nvfs struct (two
// unsigned ints, two size_t, two unsigned ints) and the flags after it.
// Later cuFile versions add fields at the end; Properties hands the
// library room to spare.
type drvProps struct {
	nvfsMajor, nvfsMinor     uint32
	pollThresh, maxDirectIO  uint64
	dstatusflags, dcontrolfl uint32
	rest                     [1024]byte
}

// Properties asks the driver for its properties.
func (d *Driver) Properties() (Properties, error) {
	var p drvProps
	if err := status("cuFileDriverGetProperties", d.l.driverGetProperties(unsafe.Pointer(&p))); err != nil {
		return Properties{}, err
	}
	return Properties{NVFSMajor: p.nvfsMajor, NVFSMinor: p.nvfsMinor, MaxDirectIOSize: p.maxDirectIO << 10}, nil
}

// Mode says whether the nvidia-fs module is loaded (ModeGDS) or cuFile runs
// in its compatibility mode (ModeCompat): the module's version is 0.0 when
// it is not.
func (d *Driver) Mode() (Mode, error) {
	p, err := d.Properties()
	if err != nil {
		return 0, err
	}
	if p.NVFSMajor == 0 && p.NVFSMinor == 0 {
		return ModeCompat, nil
	}
	return ModeGDS, nil
}

// descr is CUfileDescr_t: the handle type (an enum), then a union of an
// int fd and a pointer (so at offset 8), then the file-system operations
// table, NULL for a kernel file system.
type descr struct {
	typ   int32
	_     int32
	fd    int32
	_     int32
	fsOps uintptr
}

// handleTypeOpaqueFD is CU_FILE_HANDLE_TYPE_OPAQUE_FD: a Linux file
// descriptor.
const handleTypeOpaqueFD = 1

// Handle is a file registered with cuFile (CUfileHandle_t).
type Handle struct {
	d  *Driver
	h  uintptr
	fd int
}

// Fd is the descriptor the handle was registered for.
func (h *Handle) Fd() int { return h.fd }

// Register registers an open file's descriptor. The file must stay open
// until the handle is deregistered. In GDS mode the file must be on a file
// system nvidia-fs supports; cuFile may refuse others, or (as configured in
// cufile.json) read them in compatibility mode.
func (d *Driver) Register(fd int) (*Handle, error) {
	ds := descr{typ: handleTypeOpaqueFD, fd: int32(fd)}
	var h uintptr
	if err := status("cuFileHandleRegister", d.l.handleRegister(&h, &ds)); err != nil {
		return nil, err
	}
	return &Handle{d: d, h: h, fd: fd}, nil
}

// Deregister releases the handle; it must not be used after.
func (h *Handle) Deregister() {
	if h.h != 0 {
		h.d.l.handleDeregister(h.h)
		h.h = 0
	}
}

// RegisterBuffer registers n bytes of device memory at p, so that reads
// into it and writes from it skip cuFile's own bounce buffers; reads and
// writes then name p as their base and an offset into it. Memory already
// registered is not an error.
func (d *Driver) RegisterBuffer(p uint64, n int64) error {
	err := status("cuFileBufRegister", d.l.bufRegister(uintptr(p), uint64(n), 0))
	var e *Error
	if errors.As(err, &e) && e.Code == codeAlreadyRegistered {
		return nil
	}
	return err
}

// DeregisterBuffer undoes RegisterBuffer.
func (d *Driver) DeregisterBuffer(p uint64) error {
	return status("cuFileBufDeregister", d.l.bufDeregister(uintptr(p)))
}

// Read reads n bytes of the file at fileOff into device memory at
// base+bufOff (base: a registered buffer's start, or any device address
// with bufOff 0). It returns the bytes read, fewer than n only at the
// file's end.
func (h *Handle) Read(base uint64, n int64, fileOff, bufOff int64) (int64, error) {
	return h.io("cuFileRead", h.d.l.read, base, n, fileOff, bufOff)
}

// Write writes n bytes of device memory at base+bufOff to the file at
// fileOff, and returns the bytes written.
func (h *Handle) Write(base uint64, n int64, fileOff, bufOff int64) (int64, error) {
	return h.io("cuFileWrite", h.d.l.write, base, n, fileOff, bufOff)
}

// io makes one read or write. Its result is the byte count, or -1 with
// errno set for a file-system error, or a CUfileOpError negated; errno is
// read on the same thread right after the call.
func (h *Handle) io(op string, fn func(uintptr, uintptr, uint64, int64, int64) int64, base uint64, n, fileOff, bufOff int64) (int64, error) {
	if n < 0 || fileOff < 0 || bufOff < 0 {
		return 0, &Error{Op: op, Code: codeBase + 22} // CU_FILE_INVALID_VALUE
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r := fn(h.h, uintptr(base), uint64(n), fileOff, bufOff)
	switch {
	case r >= 0:
		return r, nil
	case r == -1:
		e := &Error{Op: op, Errno: syscall.EIO}
		if h.d.l.errnoLocation != nil {
			if p := h.d.l.errnoLocation(); p != nil && *p != 0 {
				e.Errno = syscall.Errno(*p)
			}
		}
		return 0, e
	}
	return 0, &Error{Op: op, Code: int32(-r)}
}

package cufile

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

func TestMissingLibraryIsErrNoLibrary(t *testing.T) {
	if _, err := open("/nonexistent/libcufile.so.0"); !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("open of a missing library: %v, want ErrNoLibrary", err)
	}
}

func TestStatusDecodesCUfileError(t *testing.T) {
	if err := status("cuFileDriverOpen", 0); err != nil {
		t.Fatal(err)
	}
	// err in the low half, cu_err in the high half.
	err := status("cuFileBufRegister", uint64(codeCUDADriverError)|uint64(2)<<32)
	var e *Error
	if !errors.As(err, &e) || e.Code != codeCUDADriverError || e.CUDA != 2 {
		t.Fatalf("got %#v", err)
	}
	if !strings.Contains(err.Error(), "CU_FILE_CUDA_DRIVER_ERROR") {
		t.Fatal(err)
	}
	// A CUresult is not kept for other codes.
	if err := status("x", uint64(codeBase+10)|uint64(7)<<32); !errors.As(err, &e) || e.CUDA != 0 || !strings.Contains(err.Error(), "NVFS_DRIVER_ERROR") {
		t.Fatalf("got %#v", err)
	}
	if err := (&Error{Op: "cuFileRead", Errno: syscall.EIO}); !errors.Is(err, syscall.EIO) {
		t.Fatal("a file-system error does not match its errno")
	}
}

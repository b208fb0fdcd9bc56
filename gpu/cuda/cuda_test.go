package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
)

var skip string

func TestMain(m *testing.M) {
	dir, _ := os.MkdirTemp("", "cudatest")
	how, err := cudatest.Setup(dir)
	if err != nil {
		skip = err.Error()
	} else {
		fmt.Println("cuda tests run on", how)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func device(t *testing.T) *cuda.Device {
	t.Helper()
	if skip != "" {
		t.Skip(skip)
	}
	d, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	dv, err := d.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dv.Close() })
	return dv
}

func TestBytesGoToTheDeviceAndComeBackThroughPinnedMemory(t *testing.T) {
	dv := device(t)
	if dv.Name() == "" || dv.TotalMemory() == 0 {
		t.Fatalf("device %q with %d bytes", dv.Name(), dv.TotalMemory())
	}
	const n = 1 << 20
	pinned, err := unix.Mmap(-1, 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(pinned)
	if err := dv.RegisterHost(pinned); err != nil {
		t.Fatal(err)
	}
	if err := dv.RegisterHost(pinned); err != nil {
		t.Fatalf("registering a registered region again: %v; want no error", err)
	}
	defer dv.UnregisterHost(pinned)
	src, dst := pinned[:n], pinned[n:]
	for i := range src {
		src[i] = byte(i * 7)
	}
	p, err := dv.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Free(p)
	s, err := dv.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.HtoD(p, src); err != nil {
		t.Fatal(err)
	}
	if err := s.DtoH(dst, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("the bytes came back different")
	}
}

func TestDriverErrorsNameTheCallAndTheCode(t *testing.T) {
	dv := device(t)
	free, _, err := dv.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	_, err = dv.Alloc(int64(free) + 1<<40)
	var e *cuda.Error
	if !errors.As(err, &e) || !cuda.IsOutOfMemory(err) || e.Op != "cuMemAlloc_v2" {
		t.Fatalf("allocating more than the device has: %v; want cuMemAlloc_v2's CUDA_ERROR_OUT_OF_MEMORY", err)
	}
	if _, err := cuda.Load(); err != nil {
		t.Fatal(err)
	}
	d, _ := cuda.Load()
	if _, err := d.Open(99); err == nil {
		t.Fatal("opened device 99")
	}
}

package cufile_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/gpu/cufile"
	"github.com/kvstrata/kvstrata/gpu/cufile/cufiletest"
)

var skip string

func TestMain(m *testing.M) {
	dir, _ := os.MkdirTemp("", "cufiletest")
	how, err := cudatest.Setup(dir)
	if err == nil {
		var lib string
		if lib, err = cufiletest.Setup(dir); err == nil {
			fmt.Printf("cufile tests run on %s, with %s\n", how, lib)
		}
	}
	if err != nil {
		skip = err.Error()
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// setup opens device 0 and a cuFile driver session, closed with the test.
func setup(t *testing.T) (*cuda.Device, *cufile.Driver) {
	t.Helper()
	if skip != "" {
		t.Skip(skip)
	}
	drv, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	dv, err := drv.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dv.Close() })
	lib, err := cufile.Load()
	if err != nil {
		t.Fatal(err)
	}
	var d *cufile.Driver
	if err := dv.Do(func() (err error) { d, err = lib.Open(); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dv.Do(d.Close); err != nil {
			t.Error(err)
		}
	})
	return dv, d
}

// file writes n patterned bytes to a new file and returns it open.
func file(t *testing.T, n int) (*os.File, []byte) {
	t.Helper()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	p := filepath.Join(t.TempDir(), "blocks")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, data
}

// deviceBytes copies n bytes of device memory at p into a new slice.
func deviceBytes(t *testing.T, dv *cuda.Device, p cuda.DevPtr, n int) []byte {
	t.Helper()
	s, err := dv.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := make([]byte, n)
	if err := s.DtoH(out, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReadIntoRegisteredDeviceMemory(t *testing.T) {
	dv, d := setup(t)
	f, data := file(t, 3<<20)
	const n = 1 << 20
	buf, err := dv.Alloc(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Free(buf)
	err = dv.Do(func() error {
		if err := d.RegisterBuffer(uint64(buf), 2*n); err != nil {
			return err
		}
		if err := d.RegisterBuffer(uint64(buf), 2*n); err != nil {
			return fmt.Errorf("registering twice: %w", err)
		}
		h, err := d.Register(int(f.Fd()))
		if err != nil {
			return err
		}
		defer h.Deregister()
		// Bytes [n, 2n) of the file into the second half of the buffer.
		got, err := h.Read(uint64(buf), n, n, n)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("read %d bytes, want %d", got, n)
		}
		// Past the registered buffer's end: refused.
		if _, err := h.Read(uint64(buf), n, 0, n+1); err == nil {
			return errors.New("a read past the registered buffer succeeded")
		}
		// At the file's end: short.
		if got, err := h.Read(uint64(buf), n, int64(len(data))-100, 0); err != nil || got != 100 {
			return fmt.Errorf("a read at the end: %d bytes, %v; want 100", got, err)
		}
		return d.DeregisterBuffer(uint64(buf))
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := deviceBytes(t, dv, buf+n, n); !bytes.Equal(got, data[n:2*n]) {
		t.Fatal("device memory does not hold the bytes read")
	}
	if got := deviceBytes(t, dv, buf, 100); !bytes.Equal(got, data[len(data)-100:]) {
		t.Fatal("device memory does not hold the bytes of the short read")
	}
}

func TestModeAndFailedReads(t *testing.T) {
	dv, d := setup(t)
	if !cufiletest.Fake() {
		t.Skip("the machine's cuFile library: its mode is the machine's, its reads cannot be made to fail")
	}
	f, _ := file(t, 64<<10)
	buf, err := dv.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Free(buf)
	err = dv.Do(func() error {
		for _, want := range []cufile.Mode{cufile.ModeCompat, cufile.ModeGDS} {
			cufiletest.SetGDS(want == cufile.ModeGDS)
			if m, err := d.Mode(); err != nil || m != want {
				return fmt.Errorf("mode %v, %v; want %v", m, err, want)
			}
		}
		cufiletest.SetGDS(false)
		h, err := d.Register(int(f.Fd()))
		if err != nil {
			return err
		}
		if n, ok := cufiletest.Handles(); !ok || n != 1 {
			return fmt.Errorf("%d handles registered, want 1", n)
		}
		cufiletest.FailReads(1)
		_, err = h.Read(uint64(buf), 64<<10, 0, 0)
		var e *cufile.Error
		if !errors.Is(err, syscall.EIO) || !errors.As(err, &e) || e.Op != "cuFileRead" {
			return fmt.Errorf("a failed read returned %v, want cuFileRead's EIO", err)
		}
		if n, err := h.Read(uint64(buf), 64<<10, 0, 0); err != nil || n != 64<<10 {
			return fmt.Errorf("the read after: %d, %v", n, err)
		}
		h.Deregister()
		if n, _ := cufiletest.Handles(); n != 0 {
			return fmt.Errorf("%d handles registered after Deregister, want 0", n)
		}
		// A descriptor that is not open is refused with a cuFile code.
		if _, err := d.Register(1 << 20); !errors.As(err, &e) || e.Code == 0 {
			return fmt.Errorf("registering a closed descriptor: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Package cufiletest gives tests a cuFile library to go with the CUDA
// driver gpu/cuda/cudatest chose: where that is the stand-in driver, a
// stand-in libcufile built from fakecufile.c with the C compiler, which
// reads files into the stand-in's "device memory" (host memory) with
// pread; where it is the machine's driver, the machine's libcufile.so.0,
// if it has one.
package cufiletest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"

	"github.com/kvstrata/kvstrata/gpu/cuda/cudatest"
	"github.com/kvstrata/kvstrata/gpu/cufile"
)

//go:embed testdata/fakecufile.c
var fakeSource []byte

// Setup picks the library a test binary's cufile.Load will open, before
// it is first called; cudatest.Setup must have run first. It returns
// which, in words, or an error saying why there is none (no C compiler;
// or a real GPU without libcufile.so.0): the caller skips its cuFile tests
// with that line.
func Setup(dir string) (string, error) {
	if p := os.Getenv(cufile.LibraryEnv); p != "" {
		if hooks(p) == nil {
			fake = p
		}
		return "the cuFile library at $" + cufile.LibraryEnv + " (" + p + ")", nil
	}
	if !cudatest.Fake() {
		if realLibrary() {
			return "the machine's cuFile library", nil
		}
		return "", errors.New("no libcufile.so.0 here (GDS is not installed), and the stand-in works only with the stand-in CUDA driver")
	}
	src := filepath.Join(dir, "fakecufile.c")
	if err := os.WriteFile(src, fakeSource, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libfakecufile.so")
	out, err := exec.Command("cc", "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("the stand-in cuFile library does not build (%v): %s", err, out)
	}
	os.Setenv(cufile.LibraryEnv, lib)
	fake = lib
	return "a stand-in cuFile library that reads with pread into the stand-in driver's memory", nil
}

// realLibrary reports whether libcufile.so.0 is in the dynamic loader's
// cache or a usual directory, without loading it.
func realLibrary() bool {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil && strings.Contains(string(out), "libcufile.so.0 ") {
		return true
	}
	dirs := append(filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")),
		"/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "libcufile.so.0")); err == nil {
			return true
		}
	}
	return false
}

var (
	fake     string // the stand-in's path, once Setup chose it
	hookMu   sync.Mutex
	failHook func(n int32)
	gdsHook  func(on int32)
	handlesH func() int32
	regHook  func() uint64
)

// hooks binds the stand-in's test hooks in the library at path.
func hooks(path string) error {
	hookMu.Lock()
	defer hookMu.Unlock()
	if failHook != nil {
		return nil
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return err
	}
	for _, h := range []struct {
		fn   any
		name string
	}{{&gdsHook, "fakecufile_set_gds"}, {&handlesH, "fakecufile_handles"}, {&regHook, "fakecufile_registered"}, {&failHook, "fakecufile_fail_reads"}} {
		sym, err := purego.Dlsym(lib, h.name)
		if err != nil {
			return err
		}
		purego.RegisterFunc(h.fn, sym)
	}
	return nil
}

// Fake reports whether the tests run on the stand-in library; the hooks
// below work only then.
func Fake() bool { return fake != "" && hooks(fake) == nil }

// FailReads makes the stand-in fail the next n reads: each delivers half
// its bytes and then fails with EIO. It returns false, doing nothing, on
// the machine's library: callers skip then.
func FailReads(n int) bool {
	if !Fake() {
		return false
	}
	failHook(int32(n))
	return true
}

// SetGDS makes the stand-in report GPUDirect Storage proper (on: the
// nvidia-fs module's version is not 0.0) or its compatibility mode (off,
// the default). It returns false on the machine's library.
func SetGDS(on bool) bool {
	if !Fake() {
		return false
	}
	v := int32(0)
	if on {
		v = 1
	}
	gdsHook(v)
	return true
}

// Handles returns how many file handles the stand-in holds registered, and
// false on the machine's library.
func Handles() (int, bool) {
	if !Fake() {
		return 0, false
	}
	return int(handlesH()), true
}

// RegisteredBytes returns how many bytes of buffers the stand-in holds
// registered, and false on the machine's library.
func RegisteredBytes() (int64, bool) {
	if !Fake() {
		return 0, false
	}
	return int64(regHook()), true
}

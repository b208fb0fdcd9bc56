// Package cudatest gives tests a CUDA driver: the machine's own where it
// has a GPU, else a stand-in built from fakecuda.c with the C compiler, which
// keeps "device memory" in host memory. Code that drives the GPU is then
// tested everywhere for its logic, and on a GPU for real.
package cudatest

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ebitengine/purego"

	"github.com/kvstrata/kvstrata/gpu/cuda"
)

//go:embed testdata/fakecuda.c
var fakeSource []byte

// Setup picks the driver a test binary's cuda.Load will open, before it is
// first called (from TestMain): the real one when libcuda.so.1 loads and
// finds a device, else the stand-in compiled into dir. It returns which, in
// words, or an error saying why neither can be had (no GPU and no C
// compiler): the caller skips its GPU tests with that line.
func Setup(dir string) (string, error) {
	if p := os.Getenv(cuda.LibraryEnv); p != "" {
		if isFake(p) {
			fake = p
		}
		return "the driver at $" + cuda.LibraryEnv + " (" + p + ")", nil
	}
	if os.Getenv("KVSTRATA_FAKE_CUDA") == "" && realDriver() {
		return "the machine's CUDA driver", nil
	}
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, fakeSource, 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libfakecuda.so")
	out, err := exec.Command("cc", "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("no GPU here, and the stand-in driver does not build (%v): %s", err, out)
	}
	os.Setenv(cuda.LibraryEnv, lib)
	fake = lib
	return "a stand-in driver with device memory in host memory (no GPU here)", nil
}

// isFake reports whether the library at path is the stand-in (it has the
// stand-in's test hooks).
func isFake(path string) bool {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return false
	}
	_, err = purego.Dlsym(lib, "fakecuda_fail_copies")
	return err == nil
}

// realDriver reports whether the machine's libcuda.so.1 is there — in
// the dynamic loader's cache, a directory of $LD_LIBRARY_PATH or a usual
// library directory; it does not load it (cuda.Load may then load only
// one driver per process).
func realDriver() bool {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil && strings.Contains(string(out), "libcuda.so.1 ") {
		return true
	}
	dirs := append(filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")),
		"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/local/nvidia/lib64")
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "libcuda.so.1")); err == nil {
			return true
		}
	}
	return false
}

// Fake reports whether Setup chose the stand-in driver, whose device
// pointers are host addresses: another stand-in (gpu/cufile/cufiletest)
// may then read and write "device memory" as host memory.
func Fake() bool { return fake != "" }

var (
	fake      string // the stand-in's path, once Setup built it
	hookOnce  sync.Once
	failHook  func(n int32)
	errNoHook error
)

// FailCopies makes the stand-in driver fail the next n copies queued on
// any stream: each carries out half its bytes, and the synchronization of
// its stream reports CUDA_ERROR_LAUNCH_FAILED, as an error on a device
// would. It returns false, doing nothing, where the tests run on the
// machine's own driver, which cannot be told to fail: callers skip then.
func FailCopies(n int) bool {
	if fake == "" {
		return false
	}
	hookOnce.Do(func() {
		lib, err := purego.Dlopen(fake, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			errNoHook = err
			return
		}
		sym, err := purego.Dlsym(lib, "fakecuda_fail_copies")
		if err != nil {
			errNoHook = err
			return
		}
		purego.RegisterFunc(&failHook, sym)
	})
	if errNoHook != nil {
		return false
	}
	failHook(int32(n))
	return true
}

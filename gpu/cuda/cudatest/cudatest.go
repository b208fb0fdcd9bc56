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
	return "a stand-in driver with device memory in host memory (no GPU here)", nil
}

// realDriver reports whether the machine's libcuda.so.1 is there; it does
// not load it (cuda.Load may then load only one driver per process).
func realDriver() bool {
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib"} {
		if _, err := os.Stat(filepath.Join(dir, "libcuda.so.1")); err == nil {
			return true
		}
	}
	return false
}

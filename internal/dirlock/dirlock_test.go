package dirlock_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/internal/dirlock"
)

func TestASecondHolderIsRefusedUntilTheFirstReleases(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "node")
	first, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dirlock.Acquire(dir)
	if !errors.Is(err, dirlock.ErrInUse) {
		t.Fatalf("a second Acquire while held: %v, want ErrInUse", err)
	}
	if want := fmt.Sprintf("process %d", os.Getpid()); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q names neither the directory nor %s", err, want)
	}
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	second, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	second.Release()
	if err := second.Release(); err != nil {
		t.Errorf("a second Release: %v", err)
	}
}

// A holder that dies without releasing, as a node killed with -9 does,
// leaves the directory free.
func TestAKilledHolderLeavesNoStaleLock(t *testing.T) {
	if os.Getenv("DIRLOCK_HOLD") != "" {
		if _, err := dirlock.Acquire(os.Getenv("DIRLOCK_HOLD")); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		select {}
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAKilledHolderLeavesNoStaleLock$")
	cmd.Env = append(os.Environ(), "DIRLOCK_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	buf := make([]byte, 64)
	if n, _ := out.Read(buf); !strings.HasPrefix(string(buf[:n]), "held") {
		t.Fatalf("the holder said %q", buf[:n])
	}
	_, err = dirlock.Acquire(dir)
	if want := fmt.Sprintf("process %d", cmd.Process.Pid); !errors.Is(err, dirlock.ErrInUse) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Acquire while another process holds it: %v, want ErrInUse naming %s", err, want)
	}
	cmd.Process.Kill()
	cmd.Wait()
	l, err := dirlock.Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after the holder was killed: %v", err)
	}
	l.Release()
}

func TestAnUnusableDirectoryIsAnError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := dirlock.Acquire(filepath.Join(file, "dir")); err == nil || errors.Is(err, dirlock.ErrInUse) {
		t.Fatalf("Acquire under a regular file: %v", err)
	}
}

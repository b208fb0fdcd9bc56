// Package dirlock gives one process at a time a directory: a cache node
// holds its data directory (and its SSD tier's, when that is elsewhere)
// for as long as it runs, so that a second node started on the same
// directory (a second `kvstrata serve`, a `kvstrata up` beside one) is
// refused at once, saying which process holds it, instead of failing
// later on one of the stores inside with "resource temporarily
// unavailable".
//
// The hold is an flock(2) on the file kvstrata.lock in the directory (not
// LOCK, Pebble's name in the directories of its stores), released when the
// holder closes it or exits, however it exits: a node killed with -9
// leaves no stale lock. The file records the holder's process id, for the
// error only.
package dirlock

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrInUse is what Acquire returns, wrapped, when another holder has the
// directory.
var ErrInUse = errors.New("in use")

// FileName is the lock file's name in the directory.
const FileName = "kvstrata.lock"

// Lock is a held directory.
type Lock struct {
	f *os.File
}

// Acquire makes dir (and its parents) if missing and holds it, or fails at
// once with an error wrapping ErrInUse that names the holder's process id.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("directory %s: %w", dir, err)
	}
	if err := flock(f); err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil && pid > 0 {
				holder = fmt.Sprintf("process %d", pid)
			}
		}
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("directory %s is %w by %s", dir, ErrInUse, holder)
		}
		return nil, fmt.Errorf("directory %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// flock takes an exclusive flock on f without waiting, retrying a call an
// interrupting signal cut short.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Release lets the directory go. The file stays: removing it would let a
// process that opened it before the removal hold a lock no one else sees.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

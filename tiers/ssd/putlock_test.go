package ssd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// heldCreates is the operating system's file system, except that the
// creation of a block file, once armed, waits until the test lets it go:
// a create held up by the file system's journal.
type heldCreates struct {
	vfs.FS
	armed   chan struct{} // closed to arm
	entered chan struct{} // closed when a held create began
	release chan struct{} // closed to let it go
}

func (h *heldCreates) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	select {
	case <-h.armed:
		if strings.Contains(name, blocksDir) {
			close(h.entered)
			<-h.release
		}
	default:
	}
	return h.FS.Create(name, category)
}

// A Put of a block kept in a file of its own writes the file before it
// takes the key's lock: a reader of the key, or of any key of its stripe,
// does not wait for the file system meanwhile, and reads the block the
// Put replaces until the Put commits.
func TestAPutWritesItsBlockFileOutsideTheKeysLock(t *testing.T) {
	fs := &heldCreates{FS: vfs.Default, armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	tr := openTest(t, Config{FS: fs, Capacity: 1 << 30, MaxBlockSize: 1 << 20})
	oldM, oldB := tiertest.Block(1, 64<<10)
	if err := tr.Put(oldM, oldB); err != nil {
		t.Fatal(err)
	}
	newB := bytes.Repeat([]byte{7}, 64<<10)
	newM := index.Header{Key: oldM.Key, Meta: index.Meta{Size: uint32(len(newB))}, Sum: index.Checksum(newB)}
	close(fs.armed)
	done := make(chan error, 1)
	go func() { done <- tr.Put(newM, newB) }()
	<-fs.entered // the Put is creating the block's file
	s := tr.stripe(oldM.Key)
	locked := !s.TryRLock()
	if !locked {
		s.RUnlock()
	}
	var got []byte
	var gm index.Header
	var err error
	if !locked { // else Get would wait for the held create
		got, gm, err = tr.Get(oldM.Key, nil)
	}
	close(fs.release)
	if perr := <-done; perr != nil {
		t.Fatal(perr)
	}
	if locked {
		t.Fatal("the key's lock is held while the Put creates the block's file")
	}
	if err != nil || gm != oldM || !bytes.Equal(got, oldB) {
		t.Fatalf("a Get while the Put writes its file: %v, %+v, the old block %v", err, gm, bytes.Equal(got, oldB))
	}
	if got, gm, err := tr.Get(oldM.Key, nil); err != nil || gm != newM || !bytes.Equal(got, newB) {
		t.Fatalf("a Get after the Put: %v, %+v, the new block %v", err, gm, bytes.Equal(got, newB))
	}
}

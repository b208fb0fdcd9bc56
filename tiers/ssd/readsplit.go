package ssd

import (
	"io"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pebble reads an inline block's bytes from its blob file with one
// synchronous read, on a file it opened with kernel readahead turned off
// (random reads would waste it): the disk sees one request at a time per
// Get. (Block files are read otherwise: see readBlock.) The
// files the tier's FS opens for reading split a large read into pieces read
// in parallel, so that the disk works on several at once — what its
// bandwidth needs, and what a plain sequential read gets from readahead.
const (
	// splitReadMin is the smallest read that is split: blocks of the
	// sizes the tier is for (a KV-cache block is 0.5–4 MiB), not Pebble's
	// metadata blocks of a few KiB. Such blocks are inline only with a
	// Config.FileMinSize over it.
	splitReadMin = 512 << 10
	// splitReadPiece is the size of the pieces.
	splitReadPiece = 256 << 10
)

// Open opens a file for reading; its large reads are split (see
// splitReadMin).
func (fs *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return splitReadFile{f}, nil
}

// splitReadFile is a file whose ReadAt of splitReadMin bytes or more reads
// pieces of splitReadPiece bytes in parallel.
type splitReadFile struct{ vfs.File }

// ReadAt reads len(p) bytes at off, as io.ReaderAt: n < len(p) comes with
// an error (io.EOF at the end of the file), and the bytes up to n are
// read.
func (f splitReadFile) ReadAt(p []byte, off int64) (int, error) {
	if len(p) < splitReadMin {
		return f.File.ReadAt(p, off)
	}
	pieces := (len(p) + splitReadPiece - 1) / splitReadPiece
	ns := make([]int, pieces)
	errs := make([]error, pieces)
	var wg sync.WaitGroup
	for i := 1; i < pieces; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns[i], errs[i] = f.readPiece(p, off, i)
		}()
	}
	ns[0], errs[0] = f.readPiece(p, off, 0)
	wg.Wait()
	n := 0
	for i := range pieces {
		n += ns[i]
		if errs[i] != nil {
			return n, errs[i]
		}
		if want := min(splitReadPiece, len(p)-i*splitReadPiece); ns[i] < want {
			return n, io.ErrUnexpectedEOF // a reader that breaks its contract
		}
	}
	return n, nil
}

// readPiece reads the i-th piece of p, which starts at off in the file.
func (f splitReadFile) readPiece(p []byte, off int64, i int) (int, error) {
	lo := i * splitReadPiece
	hi := min(lo+splitReadPiece, len(p))
	return f.File.ReadAt(p[lo:hi], off+int64(lo))
}

//go:build cuda

package hbm

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvstrata/kvstrata/gpu/cuda"
	"github.com/kvstrata/kvstrata/gpu/cufile"
	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// Filling blocks from files (tiers.FileFiller). A promotion out of the SSD
// tier hands the tier the file and offset of a block, and FillFromFile
// reads it into the pages it reserved, in one of three ways, chosen at
// Open (Config.GDS) and reported in Detail as gds_mode:
//
//   - cuFile with the nvidia-fs module (gds_mode 3, gds_bytes): GPUDirect
//     Storage, the disk's DMA writes into device memory.
//   - cuFile in its compatibility mode (2, gds_compat_bytes): the library
//     reads through host buffers of its own.
//   - staged (1, file_staged_bytes): pread into the tier's own pinned host
//     buffers, a chunk at a time, each chunk copied to the device while
//     the next is read.
//
// The tier registers its whole pool with cuFile once (cuFileBufRegister),
// so reads land in it without cuFile's bounce buffers, and keeps a
// registered handle per open file (by descriptor, device and inode; the
// least recently used of more than maxHandles is deregistered). A cuFile
// read that fails is done again staged (gds_errors counts them).
//
// The bytes are checked against the block's checksum before the block is
// stored: staged, in the pinned buffers before each chunk's copy; through
// cuFile, whose bytes never pass through host memory the tier sees, by
// copying them back into the pinned buffers and hashing them there
// (file_verified_bytes), unless Config.GDSTrustDisk. A block that fails is
// not stored (ErrCorrupt; file_corrupt counts them).

// Values of Detail's gds_mode.
const (
	modeOff    = 0
	modeStaged = 1
	modeCompat = 2
	modeGDS    = 3
)

// stagingChunk is the size of each pinned staging buffer; every stream has
// two, one read into while the other is copied.
const stagingChunk = 1 << 20

// maxHandles bounds the cuFile handles kept registered.
const maxHandles = 64

// fileReader is the tier's state for FillFromFile. Its counters are
// guarded by the tier's mu, its handles by hmu.
type fileReader struct {
	mode int64  // modeOff …
	why  string // why cuFile is not used, when mode is staged under GDSAuto

	cf              *cufile.Driver // nil unless cuFile reads
	registered      bool           // the pool is registered with cuFile
	registeredBytes int64
	staging         *pinnedPool // a slot per stream, each two chunks

	hmu     sync.Mutex
	handles map[fileID]*handle
	tick    uint64

	fills, corrupt, gdsErrors                    int64
	gdsBytes, compatBytes, stagedBytes, verified int64
}

// fileID names an open file: its descriptor and what it is open on.
type fileID struct {
	fd       int
	dev, ino uint64
}

type handle struct {
	h     *cufile.Handle
	users int
	used  uint64 // the tick of its last use
}

// halves cuts a staging slot in two chunks: one is read or hashed while
// the other is copied.
func halves(slot []byte) [2][]byte {
	return [2][]byte{slot[:stagingChunk:stagingChunk], slot[stagingChunk:]}
}

// openFiles sets up FillFromFile as cfg.GDS asks.
func (t *Tier) openFiles() error {
	f := &t.files
	if t.cfg.GDS == GDSOff {
		f.mode = modeOff
		return nil
	}
	staging, err := newPinnedPool(t.dev, t.cfg.Streams, 2*stagingChunk)
	if err != nil {
		return fmt.Errorf("hbm: mapping staging buffers: %w", err)
	}
	f.staging = staging
	f.mode = modeStaged
	if t.cfg.GDS == GDSStaged {
		return nil
	}
	if err := t.openCuFile(); err != nil {
		f.why = err.Error()
	}
	return nil
}

// openCuFile starts a cuFile session and registers the pool with it.
func (t *Tier) openCuFile() error {
	lib, err := cufile.Load()
	if err != nil {
		return err
	}
	f := &t.files
	return t.dev.Do(func() error {
		d, err := lib.Open()
		if err != nil {
			return err
		}
		mode, err := d.Mode()
		if err != nil {
			d.Close()
			return err
		}
		// Without the registration cuFile still reads into the pool,
		// through bounce buffers of its own in device memory.
		if f.registered = d.RegisterBuffer(uint64(t.pool), t.size) == nil; f.registered {
			f.registeredBytes = t.size
		}
		f.cf, f.mode = d, modeCompat
		if mode == cufile.ModeGDS {
			f.mode = modeGDS
		}
		f.handles = map[fileID]*handle{}
		return nil
	})
}

// closeFiles undoes openFiles; the tier's mu is held.
func (t *Tier) closeFiles() []error {
	f := &t.files
	var errs []error
	if f.cf != nil {
		err := t.dev.Do(func() error {
			f.hmu.Lock()
			for id, h := range f.handles {
				h.h.Deregister()
				delete(f.handles, id)
			}
			f.hmu.Unlock()
			var errs []error
			if f.registered {
				errs = append(errs, f.cf.DeregisterBuffer(uint64(t.pool)))
			}
			return errors.Join(append(errs, f.cf.Close())...)
		})
		if err != nil {
			errs = append(errs, err)
		}
		f.cf = nil
	}
	if err := f.staging.close(t.dev); err != nil {
		errs = append(errs, err)
	}
	f.staging = nil
	return errs
}

// detail adds the counters to d; the tier's mu is held.
func (f *fileReader) detail(d map[string]int64) {
	d["gds_mode"] = f.mode
	d["gds_bytes"], d["gds_compat_bytes"], d["file_staged_bytes"] = f.gdsBytes, f.compatBytes, f.stagedBytes
	d["file_verified_bytes"], d["file_fills"], d["file_corrupt"], d["gds_errors"] = f.verified, f.fills, f.corrupt, f.gdsErrors
	d["gds_registered_bytes"], d["file_staging_pinned_bytes"] = f.registeredBytes, f.staging.pinnedBytes()
}

// FileReads says how FillFromFile reads — "gds", "compat" (cuFile in its
// compatibility mode), "staged" or "off" — and, when it is staged although
// Config.GDS asked for cuFile where it loads, why cuFile is not used.
func (t *Tier) FileReads() (mode, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return [...]string{"off", "staged", "compat", "gds"}[t.files.mode], t.files.why
}

// FillFromFile reads the block of ext into device memory (tiers.FileFiller)
// and stores it under its Meta once its bytes match the Meta's Sum: a
// promotion from the SSD tier with no host buffer the caller fills. It
// fails with a *tiers.SizeError over the block limit, ErrFull without
// room, an error wrapping tiers.ErrCorrupt when the bytes do not match
// (nothing is stored), and errors.ErrUnsupported when Config.GDS is off.
func (t *Tier) FillFromFile(ext tiers.FileExtent) error {
	if t.files.mode == modeOff {
		return fmt.Errorf("hbm: filling blocks from files is off: %w", errors.ErrUnsupported)
	}
	m := ext.Meta()
	if int64(m.Size) > t.cfg.MaxBlockSize {
		return &tiers.SizeError{Size: int64(m.Size), Limit: t.cfg.MaxBlockSize}
	}
	if ext.Offset() < 0 {
		return fmt.Errorf("hbm: %w: %v at offset %d", tiers.ErrInvalid, m.Key, ext.Offset())
	}
	b, err := t.reserve(m)
	if err != nil {
		return err
	}
	return t.publish(b, t.fill(ext, b))
}

// fill reads ext into b's pages and checks the bytes.
func (t *Tier) fill(ext tiers.FileExtent, b *block) error {
	f := &t.files
	m, n, off := b.meta, int64(b.meta.Size), ext.Offset()
	via, staged := &f.stagedBytes, true
	var sum uint64
	var err error
	if f.cf != nil {
		if err = t.readCuFile(ext.File(), off, b, n); err == nil {
			staged, via, sum = false, &f.compatBytes, m.Sum
			if f.mode == modeGDS {
				via = &f.gdsBytes
			}
			if !t.cfg.GDSTrustDisk {
				sum, err = t.hashDevice(t.addr(b), n)
				if err == nil {
					t.mu.Lock()
					f.verified += n
					t.mu.Unlock()
				}
			}
		} else {
			t.mu.Lock()
			f.gdsErrors++
			t.mu.Unlock()
		}
	}
	if staged {
		sum, err = t.readStaged(ext.File(), off, t.addr(b), n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("hbm: reading %v from its file into the device: %w", m.Key, err)
	}
	if sum != m.Sum {
		f.corrupt++
		return fmt.Errorf("hbm: %v read from its file does not match its checksum: %w", m.Key, tiers.ErrCorrupt)
	}
	f.fills++
	*via += n
	return nil
}

// readCuFile reads n bytes of file at off into b's pages through cuFile.
func (t *Tier) readCuFile(file tiers.BlockFile, off int64, b *block, n int64) error {
	h, id, err := t.handle(int(file.Fd()))
	if err != nil {
		return err
	}
	defer t.unhandle(id)
	base, at := uint64(t.addr(b)), int64(0)
	if t.files.registered {
		base, at = uint64(t.pool), int64(t.addr(b)-t.pool)
	}
	return t.dev.Do(func() error {
		for done := int64(0); done < n; {
			r, err := h.Read(base, n-done, off+done, at+done)
			if err != nil {
				return err
			}
			if r == 0 {
				return io.ErrUnexpectedEOF
			}
			done += r
		}
		return nil
	})
}

// handle returns the cuFile handle of the file open at fd, registering it
// the first time, and holds it until unhandle.
func (t *Tier) handle(fd int) (*cufile.Handle, fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fileID{}, fmt.Errorf("hbm: fstat of a block file: %w", err)
	}
	id := fileID{fd: fd, dev: uint64(st.Dev), ino: st.Ino}
	f := &t.files
	f.hmu.Lock()
	defer f.hmu.Unlock()
	f.tick++
	if h := f.handles[id]; h != nil {
		h.users++
		h.used = f.tick
		return h.h, id, nil
	}
	var ch *cufile.Handle
	err := t.dev.Do(func() (err error) { ch, err = f.cf.Register(fd); return err })
	if err != nil {
		return nil, id, err
	}
	if len(f.handles) >= maxHandles {
		var lru *handle
		var lruID fileID
		for hid, h := range f.handles {
			if h.users == 0 && (lru == nil || h.used < lru.used) {
				lru, lruID = h, hid
			}
		}
		if lru != nil {
			_ = t.dev.Do(func() error { lru.h.Deregister(); return nil })
			delete(f.handles, lruID)
		}
	}
	f.handles[id] = &handle{h: ch, users: 1, used: f.tick}
	return ch, id, nil
}

func (t *Tier) unhandle(id fileID) {
	f := &t.files
	f.hmu.Lock()
	defer f.hmu.Unlock()
	if h := f.handles[id]; h != nil {
		h.users--
	}
}

// readStaged reads n bytes of file at off into device memory at dst
// through a pair of pinned staging buffers, and returns their checksum,
// computed in the buffers before each chunk's copy: chunk i+1 is read
// while chunk i is copied.
func (t *Tier) readStaged(file tiers.BlockFile, off int64, dst cuda.DevPtr, n int64) (uint64, error) {
	buf := t.files.staging.get()
	defer t.files.staging.put(buf)
	slot := halves(buf)
	s := <-t.streams
	defer func() { t.streams <- s }()
	d := index.NewDigest()
	pending := false // a copy is queued and not yet synchronized
	defer func() {
		if pending {
			_ = s.Sync() // the buffer must not go back to the pool in use
		}
	}()
	for i, done := 0, int64(0); done < n; i++ {
		buf := slot[i%2][:min(stagingChunk, n-done)]
		if r, err := file.ReadAt(buf, off+done); r < len(buf) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		_, _ = d.Write(buf)
		if pending {
			pending = false
			if err := s.Sync(); err != nil {
				return 0, err
			}
		}
		if err := s.HtoD(dst+cuda.DevPtr(done), buf); err != nil {
			return 0, err
		}
		pending = true
		done += int64(len(buf))
	}
	if pending {
		pending = false
		if err := s.Sync(); err != nil {
			return 0, err
		}
	}
	return d.Sum64(), nil
}

// hashDevice copies n bytes of device memory at src back through a pair of
// pinned staging buffers and returns their checksum: chunk i is hashed
// while chunk i+1 is copied.
func (t *Tier) hashDevice(src cuda.DevPtr, n int64) (uint64, error) {
	buf := t.files.staging.get()
	defer t.files.staging.put(buf)
	slot := halves(buf)
	s := <-t.streams
	defer func() { t.streams <- s }()
	d := index.NewDigest()
	pending := false
	defer func() {
		if pending {
			_ = s.Sync()
		}
	}()
	chunk := func(i int, done int64) []byte { return slot[i%2][:min(stagingChunk, n-done)] }
	if n > 0 {
		if err := s.DtoH(chunk(0, 0), src); err != nil {
			return 0, err
		}
		pending = true
	}
	for i, done := 0, int64(0); done < n; i++ {
		cur := chunk(i, done)
		pending = false
		if err := s.Sync(); err != nil {
			return 0, err
		}
		if next := done + int64(len(cur)); next < n {
			if err := s.DtoH(chunk(i+1, next), src+cuda.DevPtr(next)); err != nil {
				return 0, err
			}
			pending = true
		}
		_, _ = d.Write(cur)
		done += int64(len(cur))
	}
	return d.Sum64(), nil
}

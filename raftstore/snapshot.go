package raftstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/hashicorp/raft"

	"github.com/kvstrata/kvstrata/index"
)

// A snapshot, as Persist writes it:
//
//	magic "KVSTRDIR", version byte 1, 2 or 3
//	frame S: uvarint applied index, then the cluster state (appendRoster)
//	frame W, in versions 2 and 3: the worker registry (appendRegistry)
//	frame P, in version 3: the planner records (appendPlannerRecords)
//	frame D, any number: directory entries, back to back, until the frame ends
//	frame E: uvarint entries, uvarint D frames
//
// A frame is a kind byte, a uvarint payload length, the payload, and the
// CRC-32C (Castagnoli) of all three, 4 bytes little-endian. Nothing may
// follow frame E. A directory entry is
//
//	flags byte (snapParent, snapNS), [namespace 8], hash 8, [parent 8],
//	uvarint size, uvarint count ≥ 1, count × (uvarint node, byte tier)
//
// where the namespace, when its flag is clear, is that of the entry before
// it in the frame (entries of one namespace dominate a directory).
//
// A snapshot of an FSM with no registered workers is written in version
// 1, which builds that know no registry read too; one with workers and no
// planner records in version 2, which builds that know no planner records
// read too.
const (
	snapMagic   = "KVSTRDIR"
	snapVersion = 3

	frameState    = 'S'
	frameRegistry = 'W'
	framePlanner  = 'P'
	frameDir      = 'D'
	frameEnd      = 'E'

	snapParent = 0x01 // the entry has a parent, which follows its hash
	snapNS     = 0x02 // the entry's namespace follows

	// dirFrameSize is the payload size at which Persist ends a D frame.
	dirFrameSize = 64 << 10
	// maxFrameSize bounds the payload Restore accepts.
	maxFrameSize = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fsmSnapshot is the FSM as of one applied index: a frozen directory and
// the (immutable) cluster state, captured without copying either.
type fsmSnapshot struct {
	dir     *index.DirectorySnapshot
	state   *roster
	workers *registry
	planner *plannerRecords
	applied uint64
}

// Snapshot captures the FSM's state in constant time (the directory's
// shards are shared until their next write copies them); Persist does the
// writing, concurrently with later Applies, which it does not see.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{dir: f.Directory().Snapshot(), state: f.state.Load(), workers: f.reg(), planner: f.plannerRecs(), applied: f.applied.Load()}, nil
}

// Persist writes the snapshot to sink and closes it, or cancels it on error.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.write(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftstore: persist snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftstore: persist snapshot: close sink: %w", err)
	}
	return nil
}

// Release lets go of the snapshot.
func (s *fsmSnapshot) Release() {}

// write writes the snapshot to w in the format above.
func (s *fsmSnapshot) write(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	bw.WriteString(snapMagic)
	version := byte(1)
	switch {
	case len(s.planner.pools) > 0:
		version = 3
	case len(s.workers.workers) > 0:
		version = 2
	}
	bw.WriteByte(version)
	buf := appendUvarint(nil, s.applied)
	buf = appendRoster(buf, s.state)
	if err := writeFrame(bw, frameState, buf); err != nil {
		return err
	}
	if version >= 2 {
		if err := writeFrame(bw, frameRegistry, appendRegistry(buf[:0], s.workers)); err != nil {
			return err
		}
	}
	if version >= 3 {
		if err := writeFrame(bw, framePlanner, appendPlannerRecords(buf[:0], s.planner)); err != nil {
			return err
		}
	}
	var entries, frames uint64
	var err error
	var prevNS index.NamespaceID
	buf = buf[:0]
	s.dir.Range(func(k index.Key, e *index.Entry) bool {
		buf = appendSnapEntry(buf, k, e, len(buf) == 0, prevNS)
		prevNS = k.NS
		entries++
		if len(buf) >= dirFrameSize {
			err = writeFrame(bw, frameDir, buf)
			buf = buf[:0]
			frames++
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if len(buf) > 0 {
		if err := writeFrame(bw, frameDir, buf); err != nil {
			return err
		}
		frames++
	}
	end := appendUvarint(appendUvarint(nil, entries), frames)
	if err := writeFrame(bw, frameEnd, end); err != nil {
		return err
	}
	return bw.Flush()
}

// writeFrame writes one frame. Write errors of a bufio.Writer stick, so
// only the last call's need checking; each is checked anyway.
func writeFrame(w *bufio.Writer, kind byte, payload []byte) error {
	var head [1 + binary.MaxVarintLen64]byte
	head[0] = kind
	n := 1 + binary.PutUvarint(head[1:], uint64(len(payload)))
	crc := crc32.Update(crc32.Update(0, castagnoli, head[:n]), castagnoli, payload)
	w.Write(head[:n])
	w.Write(payload)
	_, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc))
	return err
}

// appendSnapEntry appends one directory entry; first says it starts a
// frame, and prevNS is the namespace of the entry before it.
func appendSnapEntry(dst []byte, k index.Key, e *index.Entry, first bool, prevNS index.NamespaceID) []byte {
	flags := byte(0)
	if e.HasParent {
		flags |= snapParent
	}
	if first || k.NS != prevNS {
		flags |= snapNS
	}
	dst = append(dst, flags)
	if flags&snapNS != 0 {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(k.NS))
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(k.Hash))
	if e.HasParent {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.Parent))
	}
	dst = appendUvarint(dst, uint64(e.Size))
	dst = appendUvarint(dst, uint64(len(e.Locations)))
	for _, l := range e.Locations {
		dst = appendUvarint(dst, uint64(l.Node))
		dst = append(dst, byte(l.Tier))
	}
	return dst
}

// Restore replaces the FSM's state with the snapshot rc holds. It builds
// the new state apart and swaps it in only once the whole snapshot has
// been read and checked; on error the FSM is unchanged. Readers holding
// the old directory keep it. Restore does not close rc (raft does).
func (f *FSM) Restore(rc io.ReadCloser) error {
	dir, state, workers, planner, applied, err := readSnapshot(rc)
	if err != nil {
		return fmt.Errorf("raftstore: restore snapshot: %w", err)
	}
	f.dir.Store(dir)
	f.state.Store(state)
	f.workers.Store(workers)
	f.planner.Store(planner)
	f.applied.Store(applied)
	return nil
}

// readSnapshot reads what write wrote. An error wraps ErrCorrupt when
// the bytes are damaged, the reader's error when reading failed.
func readSnapshot(r io.Reader) (*index.Directory, *roster, *registry, *plannerRecords, uint64, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var head [len(snapMagic) + 1]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return nil, nil, nil, nil, 0, fmt.Errorf("read header: %w", eofIsCorrupt(err))
	}
	if string(head[:len(snapMagic)]) != snapMagic {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: not a directory snapshot", ErrCorrupt)
	}
	version := head[len(snapMagic)]
	if version < 1 || version > snapVersion {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: snapshot format %d, this build reads 1 to %d", ErrCorrupt, version, snapVersion)
	}
	var buf []byte
	kind, payload, err := readFrame(br, buf)
	if err != nil {
		return nil, nil, nil, nil, 0, err
	}
	if kind != frameState {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: first frame is %q, want the cluster state", ErrCorrupt, kind)
	}
	pr := reader{b: payload}
	applied := pr.uvarint()
	state := readRoster(&pr)
	if err := pr.done(); err != nil {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: cluster state: %w", ErrCorrupt, err)
	}
	workers := emptyRegistry
	if version >= 2 {
		if kind, payload, err = readFrame(br, payload); err != nil {
			return nil, nil, nil, nil, 0, err
		}
		if kind != frameRegistry {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: frame %q after the cluster state, want the worker registry", ErrCorrupt, kind)
		}
		wr := reader{b: payload}
		workers = readRegistry(&wr)
		if err := wr.done(); err != nil {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: worker registry: %w", ErrCorrupt, err)
		}
	}
	planner := emptyPlannerRecords
	if version >= 3 {
		if kind, payload, err = readFrame(br, payload); err != nil {
			return nil, nil, nil, nil, 0, err
		}
		if kind != framePlanner {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: frame %q after the worker registry, want the planner records", ErrCorrupt, kind)
		}
		pr := reader{b: payload}
		planner = readPlannerRecords(&pr)
		if err := pr.done(); err != nil {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: planner records: %w", ErrCorrupt, err)
		}
	}
	dir := index.NewDirectory()
	var entries, frames uint64
	var changes []index.Change
	for {
		kind, payload, err = readFrame(br, payload)
		if err != nil {
			return nil, nil, nil, nil, 0, err
		}
		if kind == frameEnd {
			break
		}
		if kind != frameDir {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: frame %q after the cluster state", ErrCorrupt, kind)
		}
		var n int
		if changes, n, err = decodeSnapEntries(changes[:0], payload); err != nil {
			return nil, nil, nil, nil, 0, fmt.Errorf("%w: directory frame %d: %w", ErrCorrupt, frames, err)
		}
		dir.ApplyBatch(changes)
		entries += uint64(n)
		frames++
	}
	er := reader{b: payload}
	wantEntries, wantFrames := er.uvarint(), er.uvarint()
	if err := er.done(); err != nil {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: end frame: %w", ErrCorrupt, err)
	}
	if wantEntries != entries || wantFrames != frames {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: read %d entries in %d frames, the end frame says %d in %d",
			ErrCorrupt, entries, frames, wantEntries, wantFrames)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, nil, nil, nil, 0, fmt.Errorf("%w: bytes after the end frame", ErrCorrupt)
	}
	return dir, state, workers, planner, applied, nil
}

// readFrame reads one frame into buf (reusing its memory) and checks it.
func readFrame(br *bufio.Reader, buf []byte) (kind byte, payload []byte, err error) {
	kind, err = br.ReadByte()
	if err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", eofIsCorrupt(err))
	}
	n, err := binary.ReadUvarint(br)
	if err != nil {
		return 0, nil, fmt.Errorf("read frame length: %w", eofIsCorrupt(err))
	}
	if n > maxFrameSize {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes", ErrCorrupt, n)
	}
	if uint64(cap(buf)) < n+4 {
		buf = make([]byte, n+4)
	}
	buf = buf[:n+4]
	if _, err := io.ReadFull(br, buf); err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", eofIsCorrupt(err))
	}
	payload = buf[:n]
	var head [1 + binary.MaxVarintLen64]byte
	head[0] = kind
	h := 1 + binary.PutUvarint(head[1:], n)
	crc := crc32.Update(crc32.Update(0, castagnoli, head[:h]), castagnoli, payload)
	if got := binary.LittleEndian.Uint32(buf[n:]); got != crc {
		return 0, nil, fmt.Errorf("%w: frame %q: checksum %08x, computed %08x", ErrCorrupt, kind, got, crc)
	}
	return kind, payload, nil
}

// eofIsCorrupt turns the end of a snapshot before its end frame into
// ErrCorrupt: the snapshot is truncated.
func eofIsCorrupt(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	return err
}

// decodeSnapEntries decodes the entries of a D frame into changes that
// store them, one per location, and returns how many entries it read.
func decodeSnapEntries(dst []index.Change, payload []byte) ([]index.Change, int, error) {
	r := reader{b: payload}
	var ns index.NamespaceID
	n := 0
	for len(r.b) > 0 && r.err == nil {
		flags := r.byte()
		if flags&^(snapParent|snapNS) != 0 || (n == 0 && flags&snapNS == 0) {
			return dst, n, fmt.Errorf("entry %d: bad flags %#02x", n, flags)
		}
		if flags&snapNS != 0 {
			ns = index.NamespaceID(r.u64())
		}
		c := index.Change{Kind: index.ChangeStored, Key: index.Key{NS: ns, Hash: index.Hash(r.u64())}}
		if flags&snapParent != 0 {
			c.Meta.HasParent = true
			c.Meta.Parent = index.Hash(r.u64())
		}
		c.Meta.Size = r.uint32()
		locs := r.count()
		if locs == 0 && r.err == nil {
			return dst, n, fmt.Errorf("entry %d: no locations", n)
		}
		for range locs {
			c.Loc = index.Location{Node: index.NodeID(r.uint32()), Tier: index.TierKind(r.byte())}
			dst = append(dst, c)
		}
		n++
	}
	if err := r.done(); err != nil {
		return dst, n, fmt.Errorf("entry %d: %w", n, err)
	}
	return dst, n, nil
}

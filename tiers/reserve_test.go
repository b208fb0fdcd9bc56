package tiers_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
	"github.com/kvstrata/kvstrata/tiers/tiertest"
)

// fillRoom fills r with b and sets its Sum.
func fillRoom(r *tiers.PutReservation, b []byte) {
	copy(r.Bytes(), b)
	r.SetSum(index.Checksum(b))
}

// Room from ReserveRoom leaves its key to other writers until Commit (the
// Put and Delete below would never return if it held the key); the commit
// then replaces whatever they left, and an abort leaves it. Room is made
// by evicting, as Reserve makes it.
func TestReserveRoomOwnsTheKeyOnlyAtCommit(t *testing.T) {
	h := twoLevels(t, 2, 8, nil)
	m, v1 := tiertest.Block(1, blockSize)
	r, err := h.ReserveRoom(m)
	if err != nil {
		t.Fatal(err)
	}
	put(t, h, 1)
	if err := h.Delete(m.Key); err != nil {
		t.Fatal(err)
	}
	put(t, h, 2)
	put(t, h, 3) // level 0 holds 2 blocks: room for this one evicted block 2
	v2 := bytes.Repeat([]byte{9}, blockSize)
	fillRoom(r, v2)
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	got, meta, kind, err := h.Get(m.Key, nil)
	if err != nil || !bytes.Equal(got, v2) || meta.Sum != index.Checksum(v2) || kind != index.TierDRAM {
		t.Fatalf("get after commit: %d bytes from %v, sum ok %v, %v", len(got), kind, meta.Sum == index.Checksum(v2), err)
	}
	if err := r.Commit(); !errors.Is(err, tiers.ErrInvalid) {
		t.Fatalf("second commit: %v; want ErrInvalid", err)
	}

	q, err := h.ReserveRoom(m)
	if err != nil {
		t.Fatal(err)
	}
	fillRoom(q, v1)
	q.Abort()
	if got, _, _, err := h.Get(m.Key, nil); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("get after an aborted reservation: %d bytes, %v; want the committed value", len(got), err)
	}
	// The second room evicted block 3, and its abort gave the room back.
	if used := h.Stats().Levels[0].Used; used != blockSize {
		t.Fatalf("level 0 uses %d bytes; want the committed block's alone", used)
	}
}

// A reservation still open when the hierarchy closes fails its commit and
// leaves nothing behind.
func TestReserveRoomCommitAfterClose(t *testing.T) {
	h := twoLevels(t, 4, 4, nil)
	m, v := tiertest.Block(1, blockSize)
	r, err := h.ReserveRoom(m)
	if err != nil {
		t.Fatal(err)
	}
	fillRoom(r, v)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("commit after close: %v; want ErrClosed", err)
	}
	if _, err := h.ReserveRoom(m); !errors.Is(err, tiers.ErrClosed) {
		t.Fatalf("ReserveRoom after close: %v; want ErrClosed", err)
	}
}

package transfer_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/transfer"
)

// fakeDevice is a DeviceReceiver whose "device memory" is a slice per
// block, counting the bounce buffers it lends.
type fakeDevice struct {
	dev     [][]byte
	lent    int
	failAt  int // Unstage of this block fails; -1 for none
	done    []error
	buffers int // Buffer calls (blocks kept in host memory)
}

func (f *fakeDevice) Buffer(i int, h index.Header) []byte { f.buffers++; return make([]byte, h.Size) }
func (f *fakeDevice) Done(i int, h index.Header, err error) {
	f.done[i] = err
}
func (f *fakeDevice) DeviceBuffer(i int, h index.Header) (transfer.DeviceTarget, bool) {
	if i == 1 {
		return transfer.DeviceTarget{}, false // block 1 stays in host memory
	}
	return transfer.DeviceTarget{
		Bounce: func(n int) ([]byte, func(), error) {
			f.lent++
			return make([]byte, n), func() { f.lent-- }, nil
		},
		Unstage: func(data []byte) error {
			if i == f.failAt {
				return errors.New("copy failed")
			}
			f.dev[i] = bytes.Clone(data)
			return nil
		},
	}, true
}

// Staged receives device blocks through bounce buffers it gives back,
// copies them to the device before Done, reports a failed copy, and gives
// back at end the buffers of blocks that got no Done.
func TestStagedLendsAndGivesBackBounceBuffers(t *testing.T) {
	f := &fakeDevice{dev: make([][]byte, 4), failAt: 2, done: make([]error, 4)}
	r, end := transfer.Staged(f)
	h := index.Header{Meta: index.Meta{Size: 3}}
	copy(r.Buffer(0, h), "abc")
	r.Done(0, h, nil)
	if f.done[0] != nil || string(f.dev[0]) != "abc" || f.lent != 0 {
		t.Fatalf("block 0: done %v, device %q, %d lent", f.done[0], f.dev[0], f.lent)
	}
	r.Buffer(1, h)
	r.Done(1, h, nil)
	if f.buffers != 1 || f.dev[1] != nil {
		t.Fatalf("block 1 (host memory): %d Buffer calls, device %q", f.buffers, f.dev[1])
	}
	r.Buffer(2, h)
	r.Done(2, h, nil)
	if f.done[2] == nil || !strings.Contains(f.done[2].Error(), "to the device") || f.lent != 0 {
		t.Fatalf("block 2: done %v, %d lent; want the failed copy", f.done[2], f.lent)
	}
	r.Buffer(3, h) // the Get fails before block 3's Done
	if f.lent != 1 {
		t.Fatalf("%d lent, want 1", f.lent)
	}
	end()
	if f.lent != 0 || f.dev[3] != nil {
		t.Fatalf("after end: %d lent, device %q", f.lent, f.dev[3])
	}
}

// A Receiver without DeviceBuffer is returned as it is.
func TestStagedLeavesPlainReceivers(t *testing.T) {
	var p plain
	if r, end := transfer.Staged(p); r != transfer.Receiver(p) {
		t.Fatal("Staged wrapped a plain Receiver")
	} else {
		end()
	}
}

type plain struct{}

func (plain) Buffer(int, index.Header) []byte { return nil }
func (plain) Done(int, index.Header, error)   {}
